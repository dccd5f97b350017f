--[[
grace-policy's submit-host check for Slurm's cli_filter/lua.

Runs on the submit host, as the user, before sbatch/srun/salloc hand a job
to slurmctld: the same check the plugin makes at launch (the batch script
and every command its lines will run, --wrap, or the srun/salloc command,
with the environment --export gives the job), for the job's partition,
through the `grace-policy submit` command. Findings are printed at once.
Per partition the config's `submit` decides: "warn" (default: tell, then
queue) or "enforce" (refuse the submission).

A courtesy, not a control: a user can submit with a SLURM_CONF of their
own. The plugin's launch check stays the enforcement point. This file never
refuses a job because of its own failure (a missing CLI, a crash, a
timeout), and skips srun inside an existing allocation (the plugin judges
those steps on the node).

Use it as the site's cli_filter.lua (installed as
PREFIX/share/grace-policy/cli_filter.lua; copy or link it next to
slurm.conf), or call it from an existing one:

    local grace = dofile("/usr/local/share/grace-policy/cli_filter.lua")
    grace.config = "/etc/slurm/grace-policy.toml"
    function slurm_cli_pre_submit(options, offset)
        if grace.pre_submit(options, offset) ~= slurm.SUCCESS then
            return slurm.ERROR
        end
        -- ... the site's own checks ...
        return slurm.SUCCESS
    end

Written for Lua 5.1 (Debian 12's cli_filter_lua.so) and later.
--]]

local M = {}

--- The grace-policy command (make install writes its path).
M.cli = "@GP_CLI@"
--- The site's config: the same file plugstack.conf's config= names.
M.config = "@GP_CONFIG@"
--- Seconds the check may take before the job is submitted unchecked.
M.timeout = 10

local function quote(text)
    return "'" .. string.gsub(tostring(text), "'", "'\\''") .. "'"
end

local function field(options, name)
    local ok, value = pcall(function() return options[name] end)
    if ok and value ~= nil and value ~= "" then
        return tostring(value)
    end
    return nil
end

local function command_line(options)
    local kind = field(options, "type")
    if kind ~= "sbatch" and kind ~= "srun" and kind ~= "salloc" then
        return nil
    end
    if kind == "srun" and os.getenv("SLURM_JOB_ID") ~= nil then
        return nil -- a step of an existing allocation: the plugin judges it
    end
    local words = {"timeout", "-k", "2", tostring(M.timeout), quote(M.cli), "submit",
                   "--type", kind}
    if M.config ~= nil and M.config ~= "" then
        table.insert(words, "--config")
        table.insert(words, quote(M.config))
    end
    local partition = field(options, "partition")
    if partition ~= nil then
        -- a list of partitions: the job starts in one of them; judge the first
        partition = string.match(partition, "^[^,]+")
        table.insert(words, "--partition")
        table.insert(words, quote(partition))
    end
    local export = field(options, "export")
    if export ~= nil then
        table.insert(words, "--export")
        table.insert(words, quote(export))
    end
    local chdir = field(options, "chdir")
    if chdir ~= nil then
        table.insert(words, "--chdir")
        table.insert(words, quote(chdir))
    end
    local argv = {}
    local ok, list = pcall(function() return options.argv end)
    if ok and type(list) == "table" then
        for i = 1, #list do
            argv[i] = tostring(list[i])
        end
    end
    if kind == "sbatch" then
        local wrap = field(options, "wrap")
        if wrap ~= nil then
            table.insert(words, "--wrap")
            table.insert(words, quote(wrap))
        elseif argv[1] ~= nil then
            table.insert(words, "--script")
            table.insert(words, quote(argv[1]))
            table.remove(argv, 1)
        else
            return nil -- the script comes on stdin: not readable here
        end
    end
    table.insert(words, "--")
    for i = 1, #argv do
        table.insert(words, quote(argv[i]))
    end
    return table.concat(words, " ")
end

--- Returns slurm.ERROR only when the partition refuses the job
--- (submit = "enforce" and a job the node would reject); SUCCESS otherwise.
function M.pre_submit(options, offset)
    local ok, refused = pcall(function()
        local cmd = command_line(options)
        if cmd == nil then
            return false
        end
        local pipe = io.popen(cmd .. " </dev/null 2>&1; echo \"grace-policy-rc=$?\"")
        if pipe == nil then
            return false
        end
        local output = pipe:read("*a") or ""
        pipe:close()
        local rc = tonumber(string.match(output, "grace%-policy%-rc=(%d+)%s*$") or "")
        output = string.gsub(output, "grace%-policy%-rc=%d+%s*$", "")
        if rc == 0 or rc == 2 then
            io.stderr:write(output)
        end
        return rc == 2
    end)
    if ok and refused then
        return slurm.ERROR
    end
    return slurm.SUCCESS
end

if slurm_cli_pre_submit == nil then
    function slurm_cli_pre_submit(options, offset)
        return M.pre_submit(options, offset)
    end
end
if slurm_cli_setup_defaults == nil then
    function slurm_cli_setup_defaults(options, early)
        return slurm.SUCCESS
    end
end
if slurm_cli_post_submit == nil then
    function slurm_cli_post_submit(offset, jobid, stepid)
        return slurm.SUCCESS
    end
end

return M

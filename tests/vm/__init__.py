"""The VM side of the tests: a real large-page arm64 kernel under qemu-system-aarch64."""

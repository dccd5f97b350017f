"""Python steps: what the node's CPython would import (issue 8)."""

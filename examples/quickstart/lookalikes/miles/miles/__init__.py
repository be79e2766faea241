"""Look-alike of the miles package: only what the OpenEnv tbench2 launcher imports (see ../README.md)."""

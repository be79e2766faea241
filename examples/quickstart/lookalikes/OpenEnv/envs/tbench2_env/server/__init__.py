"""The env server side of tbench2_env (look-alike: only the switch Miles checks)."""

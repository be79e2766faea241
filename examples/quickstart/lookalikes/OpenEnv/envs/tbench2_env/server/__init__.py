"""The env server side of tbench2_env: the environment (tbench2_env_environment.py) and its app (app.py)."""

"""Look-alike of Miles' openenv_launch_common.py: the launcher's preflight, with upstream's rules.

``apply_optional_env_vars`` checks, in upstream's order: the backend pair (OPENENV_TB2_TASKS_DIR and
OPENENV_SANDBOX_BACKEND come together; "agentenv" means e2b), the key supply (a non-empty key file — the
``e2b_api_key_file`` argument, i.e. E2B_API_KEY_FILE, else ~/.config/e2b/api_key — wins; an explicit file that is
missing or empty is an error; else E2B_API_KEY in the environment), ``import e2b``, the addresses forwarded by
value (E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN, OPENENV_E2B_URL_SCHEME; one with an '@' is refused), and
``import tbench2_env`` whose server/tbench2_env_environment.py must name TB2_WITHHOLD_TESTS. ``cleanup`` says
what upstream would kill (``pgrep -f`` sglang, train.py, MegatronTrain) and kills nothing.
"""

import importlib
import os
from pathlib import Path

import openenv_sandbox_common as sandbox_common


def cleanup() -> None:
    print("(look-alike) upstream kills every process matching sglang, train.py or MegatronTrain here")


def resolve_sandbox_backend(args) -> str:
    raw = (getattr(args, "openenv_sandbox_backend", "") or "").strip()
    tasks_dir = args.openenv_tb2_tasks_dir
    if not raw and not tasks_dir:
        return ""
    if not tasks_dir:
        raise ValueError(
            "sandbox backends build per-task images: set openenv_tb2_tasks_dir to a terminal-bench-2 checkout"
        )
    if not raw:
        raise ValueError(
            "openenv_tb2_tasks_dir selects per-episode sandboxes: set openenv_sandbox_backend "
            "(OPENENV_SANDBOX_BACKEND) to the provider to run them on"
        )
    return sandbox_common.resolve_backend(raw)


def _key_supply(env: dict, arg_path: str) -> None:
    key_file = Path(arg_path or "~/.config/e2b/api_key").expanduser()
    try:
        key_present = bool(key_file.read_text(encoding="utf-8").strip())
    except OSError:
        key_present = False
    if key_present:
        env["E2B_API_KEY_FILE"] = str(key_file)
        print(f"openenv: E2B credential supply: file {key_file}", flush=True)
    elif arg_path:
        raise ValueError(f"E2B_API_KEY_FILE={arg_path} is missing or empty")
    elif os.environ.get("E2B_API_KEY", "").strip():
        print("openenv: E2B credential supply: worker environment (E2B_API_KEY set here)", flush=True)
    else:
        raise ValueError(
            f"the E2B sandbox mode needs credentials: put them in a file ({key_file}; E2B_API_KEY_FILE overrides) "
            "or in the environment as E2B_API_KEY"
        )


def apply_optional_env_vars(env: dict, args) -> None:
    backend = resolve_sandbox_backend(args)
    if not backend:
        return
    if backend != "e2b":
        raise ValueError(f"(look-alike) only the e2b backend is rehearsed, not {backend}")
    _key_supply(env, getattr(args, "e2b_api_key_file", "") or "")
    try:
        importlib.import_module("e2b")
    except ImportError as e:
        raise RuntimeError(
            "this sandbox mode needs the e2b SDK in the rollout process's environment: pip install e2b"
        ) from e
    for var in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DOMAIN", "OPENENV_E2B_URL_SCHEME"):
        value = os.environ.get(var, "").strip()
        if value:
            if "@" in value:
                raise ValueError(f"{var} looks like it embeds credentials ('@')")
            env[var] = value
    print(f"openenv: E2B endpoint: {env.get('E2B_API_URL', 'E2B Cloud (default)')}", flush=True)
    try:
        import tbench2_env
    except ImportError as e:
        raise RuntimeError(
            "the sandbox modes need tbench2_env in the rollout "
            "process's environment: pip install -e '<OpenEnv>/envs/tbench2_env' "
            "from the checkout described in this directory's README"
        ) from e
    server_src = Path(tbench2_env.__file__).resolve().parent / "server" / "tbench2_env_environment.py"
    src_text = server_src.read_text(encoding="utf-8") if server_src.is_file() else ""
    if "TB2_WITHHOLD_TESTS" not in src_text:
        raise RuntimeError(
            "the installed tbench2_env server lacks the native-evaluate "
            "contract (canonical test.sh scoring / TB2_WITHHOLD_TESTS): "
            "install from an OpenEnv checkout at or after the #1012 merge "
            "(04d259ea6) — see this directory's README"
        )
    env["OPENENV_TB2_TASKS_DIR"] = args.openenv_tb2_tasks_dir

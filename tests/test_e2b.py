"""The e2b step against this project's E2B-compatible stand-in server, with real e2b SDKs.

The SDK that runner depends on (>= 2.51) creates sandboxes with POST /v2/sandboxes; an older one (< 2.51,
installed by a pip step into a venv that inherits the rest) uses POST /sandboxes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Project, free_port
from standin import standin

KEY = "e2b_" + "5ec7e7" * 7


def check_pipeline(
    url: str, key: str, python: str | None = None, extra: str = "", template: str = "runner-check"
) -> str:
    """A check that builds its template first (a fresh AgentENV has none), as the flagship's sandbox_check."""
    python_line = f"\n              python: {python}" if python else ""
    return f"""
        name: check
        secrets: [key]
        vars: {{key: "{key}"}}
        steps:
          - name: settings
            env:
              E2B_API_URL: "{url}"
              E2B_SANDBOX_URL: "{url}"
              E2B_API_KEY: "{{{{ vars.key }}}}"
          - name: check
            e2b:
              template: {template}
              template_image: ubuntu:22.04{python_line}{extra}
        """


def no_key_anywhere(project: Project, key: str, *texts: str) -> None:
    for text in texts:
        assert key not in text
    for path in (project.path / ".runner").rglob("*"):
        if path.is_file() and path.name not in ("secrets.json", "env.sh"):
            assert key not in path.read_text(errors="replace"), path


@pytest.fixture(scope="session")
def old_sdk_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv with e2b < 2.51 (from the package index), made by runner's own pip step."""
    where = tmp_path_factory.mktemp("old-sdk")
    project = Project(where)
    project.write(
        f"""
        name: old-sdk
        steps:
          - name: sdk
            pip:
              venv: venv
              python: {sys.executable}
              inherit_packages: true
              packages: ["e2b<2.51"]
        """
    )
    result = project.run("apply", timeout=600)
    if result.code != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot install e2b<2.51: {result.text}")
        pytest.skip(f"cannot install e2b<2.51 (no package index?): {result.text[-300:]}")
    return str(where / "venv" / "bin" / "python")


def test_check_passes_through_v2_then_converges_without_calling(project: Project, tmp_path: Path) -> None:
    with standin(tmp_path, KEY, "--verbose") as url:
        project.write(check_pipeline(url, KEY))
        first = project.run("apply")
        assert first.code == 0, first.text
        log = next(tmp_path.glob("standin-*.log")).read_text()
        # the template is made first, as `aenv pull` does: alias lookup (404), v3 request, v2 build, status
        assert "GET /templates/aliases/runner-check" in log and "POST /v3/templates" in log
        assert log.index("POST /v3/templates") < log.index("POST /v2/sandboxes")
        assert "POST /v2/sandboxes" in log and "POST /process.Process/Start" in log
        assert "DELETE /sandboxes/" in log  # always killed
        state = json.loads((project.path / ".runner" / "state.json").read_text())
        outputs = state["steps"]["check"]["outputs"]
        assert outputs["exit_code"] == 0 and "ok" in outputs["stdout"]
        assert outputs["sdk_version"].startswith("2.") and outputs["key_digest"].startswith("hmac-sha256:")
        # keyed: the key of the digest is only in the 0600 secrets file, and no plain hash of the API key is kept
        import hashlib
        import hmac

        secrets = json.loads((project.path / ".runner" / "secrets.json").read_text())
        digest_key = bytes.fromhex(secrets["(runner)"]["digest_key"])
        expected = hmac.new(digest_key, KEY.encode(), hashlib.sha256).hexdigest()[:32]
        assert outputs["key_digest"] == f"hmac-sha256:{expected}"
        state_text = (project.path / ".runner" / "state.json").read_text()
        assert hashlib.sha256(KEY.encode()).hexdigest()[:16] not in state_text

        calls = log.count("POST /v2/sandboxes")
        second = project.run("apply")
        assert second.code == 0 and "changed=0" in second.out, second.text
        assert next(tmp_path.glob("standin-*.log")).read_text().count("POST /v2/sandboxes") == calls

        # forced again: the template now exists, so it is not built a second time
        third = project.run("apply", "--force", "check")
        assert third.code == 0, third.text
        assert next(tmp_path.glob("standin-*.log")).read_text().count("POST /v3/templates") == 1
        no_key_anywhere(project, KEY, first.text, second.text)


def test_old_sdk_creates_through_post_sandboxes(project: Project, tmp_path: Path, old_sdk_python: str) -> None:
    with standin(tmp_path, KEY, "--verbose", "--v1-only") as url:
        project.write(check_pipeline(url, KEY, python=old_sdk_python))
        result = project.run("apply")
        assert result.code == 0, result.text
        log = next(tmp_path.glob("standin-*.log")).read_text()
        assert '"POST /sandboxes HTTP/1.1" 201' in log and "/v2/sandboxes" not in log
        # e2b < 2.51 asks for `secure: true`, so its envd calls must carry the sandbox's access token
        assert '"POST /process.Process/Start HTTP/1.1" 200' in log
        state = json.loads((project.path / ".runner" / "state.json").read_text())
        assert state["steps"]["check"]["outputs"]["sdk_version"].startswith("2.5")  # 2.50.x or older 2.5x


def test_new_sdk_against_an_old_server_names_pr_306_and_the_fixes(project: Project, tmp_path: Path) -> None:
    with standin(tmp_path, KEY, "--v1-only") as url:
        project.write(check_pipeline(url, KEY))
        result = project.run("apply")
    assert result.code == 1
    assert "405" in result.out and "POST /v2/sandboxes" in result.out and "PR #306" in result.out
    assert "e2b<2.51" in result.out and "newer AgentENV image" in result.out
    assert "Traceback" not in result.text


def test_wrong_key_is_a_401_that_never_shows_the_key(project: Project, tmp_path: Path) -> None:
    wrong = "e2b_" + "0badc0de" * 5
    with standin(tmp_path, KEY) as url:
        project.write(check_pipeline(url, wrong))
        result = project.run("apply")
    assert result.code == 1
    assert f"the API key was rejected by {url} (401)" in result.out
    assert "AENV_API_KEY" in result.out  # the hint says where the right key comes from
    no_key_anywhere(project, wrong, result.text)


def test_nothing_listening_is_connection_refused(project: Project) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    project.write(check_pipeline(url, KEY))
    result = project.run("apply")
    assert result.code == 1
    assert f"connection refused at {url}: the server at that URL is not up" in result.out
    no_key_anywhere(project, KEY, result.text)


def test_failing_command_fails_the_check_and_still_kills_the_sandbox(project: Project, tmp_path: Path) -> None:
    with standin(tmp_path, KEY, "--verbose") as url:
        project.write(check_pipeline(url, KEY, extra='\n              command: "echo broken; exit 3"'))
        result = project.run("apply")
        log = next(tmp_path.glob("standin-*.log")).read_text()
    assert result.code == 1
    assert "exited 3" in result.out and "expected 0" in result.out and "broken" in result.out
    assert "DELETE /sandboxes/" in log


def test_unknown_template_names_it_and_how_to_make_it(project: Project, tmp_path: Path) -> None:
    # no template_image: a fresh AgentENV has no templates, so it answers 400 "template gpu-box not found"
    with standin(tmp_path, KEY) as url:
        project.write(check_pipeline(url, KEY, template="gpu-box").replace("template_image: ubuntu:22.04", ""))
        result = project.run("apply")
    assert result.code == 1, result.text
    assert f"template 'gpu-box' does not exist on {url} (400: template gpu-box not found)" in result.out
    assert "template_image:" in result.out and "aenv pull ubuntu:22.04 --name gpu-box" in result.out
    assert "Traceback" not in result.text


def test_a_preset_template_needs_no_build(project: Project, tmp_path: Path) -> None:
    with standin(tmp_path, KEY, "--verbose", "--templates", "base") as url:
        project.write(check_pipeline(url, KEY, template="base").replace("template_image: ubuntu:22.04", ""))
        result = project.run("apply")
        log = next(tmp_path.glob("standin-*.log")).read_text()
    assert result.code == 0, result.text
    assert "/v3/templates" not in log and "POST /v2/sandboxes" in log


def test_a_build_the_server_cannot_do_is_a_named_template_failure(project: Project, tmp_path: Path) -> None:
    # an invalid alias is refused by AgentENV's snapshot alias rules (400), and the step says which stage failed
    with standin(tmp_path, KEY) as url:
        project.write(check_pipeline(url, KEY, template="bad.name"))
        result = project.run("apply")
    assert result.code == 1
    assert "building template 'bad.name' from ubuntu:22.04" in result.out
    assert "Traceback" not in result.text


def test_missing_settings(project: Project) -> None:
    project.write(
        """
        name: nosettings
        steps:
          - name: check
            e2b: {}
        """
    )
    env_less = project.run("apply")
    assert env_less.code == 1 and "no API URL" in env_less.out


def test_the_standin_refuses_a_non_loopback_address() -> None:
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "sandbox_standin", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "not a loopback address" in result.stderr


def test_the_sdk_version_in_the_fingerprint_is_what_importlib_metadata_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hand read of e2b's METADATA header gives metadata.version("e2b"): here, and with another e2b placed
    first on sys.path (the first one on the path wins, as for importlib.metadata)."""
    from importlib import metadata

    from steps.e2b import _own_sdk_version

    assert _own_sdk_version() == metadata.version("e2b")
    dist = tmp_path / "e2b-9.8.7.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.4\nName: e2b\nVersion: 9.8.7rc1\n\nVersion: 0.0 (the body)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _own_sdk_version() == metadata.version("e2b") == "9.8.7rc1"


# What Miles' tb2_sandbox_e2b.py does with a task (radixark/miles 31f1ca96; docs/upstream.md): a template built
# as root with layers, a sandbox from its alias with the launcher's metadata, an env server started in the
# background as root, reached at http://{get_host(port)} through the server's proxy domain, a keepalive with
# set_timeout, and the server and sandbox killed. Plus the files API the SDK offers beside it.
MILES_SEQUENCE = """
import json, os, sys, time, urllib.request
from e2b import Sandbox, Template

port, python = int(sys.argv[1]), sys.argv[2]
template = (
    Template().from_image("ubuntu:22.04").set_user("root")
    .run_cmd("mkdir -p app && echo layered > app/layer.txt").set_workdir("/app").set_envs({"GREETING": "hi"})
)
Template.build(template, alias="tb2-task-0123456789ab", cpu_count=2, memory_mb=4096)
said = {"alias": Template.alias_exists("tb2-task-0123456789ab")}
box = Sandbox.create("tb2-task-0123456789ab", metadata={"openenv-launcher": "tbench2", "task": "t1"}, timeout=60)
said["host"] = box.get_host(port)
said["run"] = box.commands.run("cat layer.txt; echo $GREETING; pwd", user="root").stdout
box.files.write("/app/note.txt", "written by the sdk")
said["read"] = box.files.read("/app/note.txt")
server = box.commands.run(f"{python} -m http.server {port} --bind 127.0.0.1", background=True, user="root")
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": os.environ["E2B_API_URL"]}))
for _ in range(100):
    try:
        with opener.open(f"http://{box.get_host(port)}/note.txt", timeout=2) as answer:
            said["health"] = [answer.status, answer.read().decode()]
            break
    except OSError:
        time.sleep(0.1)
before = box.get_info().end_at
box.set_timeout(600)
said["extended"] = (box.get_info().end_at - before).total_seconds()
said["info"] = {"memory": box.get_info().memory_mb, "metadata": box.get_info().metadata}
server.kill()
box.kill()
print(json.dumps(said))
"""


def test_miles_sandbox_sequence_runs_against_the_standin_as_against_agentenv(tmp_path: Path) -> None:
    import subprocess

    script = tmp_path / "sequence.py"
    script.write_text(MILES_SEQUENCE)
    with standin(tmp_path, KEY, "--proxy-domains", "standin.test") as url:
        env = {**os.environ, "E2B_API_KEY": KEY, "E2B_API_URL": url, "E2B_SANDBOX_URL": url}
        env.pop("E2B_DEBUG", None)
        port = free_port()
        done = subprocess.run(
            [sys.executable, str(script), str(port), sys.executable],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["alias"] is True
    assert said["host"].startswith(f"{port}-") and said["host"].endswith(".standin.test")  # the server's domain
    ran = said["run"].splitlines()
    assert ran[:2] == ["layered", "hi"] and ran[2].endswith("/app")  # layers, ENV and WORKDIR reach the sandbox
    assert said["read"] == "written by the sdk"
    assert said["health"] == [200, "written by the sdk"]  # through the proxy, into the sandbox's own server
    assert said["extended"] > 400  # set_timeout moved the end from ~60 s out to ~600 s
    assert said["info"] == {"memory": 4096, "metadata": {"openenv-launcher": "tbench2", "task": "t1"}}


# Which user a command runs as (e2b-dev/infra envd; docs/upstream.md): the Authorization's name, else the
# template's USER, else envd's default root; an unknown name is refused; a missing cwd is refused; a command
# whose client went away keeps running.
USERS_SEQUENCE = """
import json, sys, time
from e2b import Sandbox, Template

def run(box, command, **options):
    try:
        done = box.commands.run(command, **options)
        return done.stdout.split()
    except Exception as exc:
        return ["refused", type(exc).__name__, str(exc)]

said = {}
Template.build(Template().from_image("ubuntu:22.04"), alias="plain")
Template.build(Template().from_image("ubuntu:22.04").set_user("user"), alias="as-user")
box = Sandbox.create("plain", timeout=60)
said["default"] = run(box, "id -u; echo $USER; pwd; echo $HOME")
said["root"] = run(box, "id -u", user="root")
said["user"] = run(box, "id -u; echo $USER; touch x 2>/dev/null || echo denied; touch ~/y && echo wrote", user="user")
said["unknown"] = run(box, "id -u", user="nobody-here")
said["cwd"] = run(box, "pwd", cwd="/no/such/dir")
handle = box.commands.run("sleep 1; echo outlived > ~/left.txt", background=True, user="user")
handle.disconnect()
time.sleep(2.5)
said["outlived"] = box.files.read("left.txt", user="user")
try:
    box.files.read("x", user="nobody-here")
except Exception as exc:
    said["files_unknown"] = str(exc)
box.kill()
box = Sandbox.create("as-user", timeout=60)
said["template_user"] = run(box, "id -u; echo $USER")
box.files.write("note.txt", "home")
said["note"] = box.files.read("/home/user/note.txt", user="root")
box.kill()
print(json.dumps(said))
"""


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A stand-in root that an unprivileged uid can traverse (pytest's tmp_path is under a 0700 directory)."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="standin-users-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_commands_run_as_the_user_asked_for_or_are_refused_as_envd_refuses(open_root: Path) -> None:
    import subprocess

    script = open_root / "users.py"
    script.write_text(USERS_SEQUENCE)
    with standin(open_root, KEY) as url:
        env = {**os.environ, "E2B_API_KEY": KEY, "E2B_API_URL": url, "E2B_SANDBOX_URL": url}
        env.pop("E2B_DEBUG", None)
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    uid, user, cwd, home = said["default"]  # no USER in the template: envd's default, root
    assert (uid, user) == ("0", "root") and home.endswith("/root")
    assert said["root"] == ["0"]
    assert said["user"][0] != "0" and said["user"][1:] == ["user", "denied", "wrote"]  # unprivileged; its home
    assert said["unknown"][0] == "refused" and "invalid username: 'nobody-here'" in said["unknown"][2]
    assert said["cwd"][0] == "refused" and "cwd '/no/such/dir' does not exist" in said["cwd"][2]
    assert said["outlived"] == "outlived\n"  # the command ran on after its client disconnected
    assert "error looking up user 'nobody-here'" in said["files_unknown"]
    uid, user = said["template_user"]  # the template's USER is its sandboxes' default user
    assert uid != "0" and user == "user"
    assert said["note"] == "home"  # a relative path is from the default user's home


def test_where_a_user_cannot_be_honoured_the_standin_says_why(open_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The paths CI's root with unshare does not take: no network namespace (unshare missing, user namespaces off),
    as root and as an ordinary uid, and a root the unprivileged uid cannot traverse."""
    from sandbox_standin.envd import identity
    from sandbox_standin.registry import Sandbox

    hidden = open_root / "hidden"
    hidden.mkdir(mode=0o700)
    box = Sandbox("id", "tpl", "plain", "standin", hidden / "box", {}, {}, 0.0, 60.0, None)
    box.directory.mkdir()
    if os.geteuid() == 0:
        refused = identity(box, "user")
        assert isinstance(refused, str) and f"cannot reach {hidden} (mode 700)" in refused and "--root" in refused
        hidden.chmod(0o755)
        assert identity(box, "user") == ([], {"user": 1000, "group": 1000, "extra_groups": []})  # drops to 1000
        assert identity(box, "root") == ([], {})
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    refused = identity(box, "root")
    assert isinstance(refused, str) and "cannot run commands as root: it runs as uid 4321" in refused
    assert identity(box, "user") == ([], {})  # an ordinary uid is already unprivileged

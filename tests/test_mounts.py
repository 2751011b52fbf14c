"""`mounts` locations: where a relative one resolves, the folders no mount may reach, and links in the workspace.

Every refusal is a config error (exit 2) naming the file and line, `mounts[N].location`, the path and
why, before limactl is called; each class has a control that the same kind of mount, legitimate, reaches
the rendered lima.yaml (the double's instance for the one `start` that goes through).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from agentbox import paths
from tests.helpers import NAME, READ_ONLY_CACHE, FakeLima, needs_bwrap, run_cli, write, write_trusted


def global_config(home: Path, text: str) -> Path:
    return write(home / ".config" / "agentbox" / "config.yml", text)


def refused(project: Path, limactl: FakeLima, *expected: str) -> str:
    """`agentbox start` refuses with a config error that says all of `expected`, and calls no limactl."""
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    message = " ".join(result.stderr.split())  # the error is wrapped to the terminal's width
    for text in expected:
        assert " ".join(text.split()) in message, (text, result.stderr)
    assert "Nothing was created or started." in message
    assert limactl.calls() == []
    assert not (limactl.home / NAME).exists()
    return message


def extra_mounts(project: Path) -> list[dict]:
    """The `mounts` entries of the rendered lima.yaml after agentbox's own (workspace, staging, outbox)."""
    result = run_cli("template", cwd=project)
    assert result.exit_code == 0, result.stderr
    return yaml.safe_load(result.stdout)["mounts"][3:]


# -- a relative location in the global config ---------------------------------------------------------------


def test_a_global_relative_location_never_resolves_in_the_workspace(project: Path, home: Path,
                                                                  limactl: FakeLima) -> None:
    write(home / ".ssh" / "id_ed25519", "PRIVATE KEY\n")
    (project / "data").symlink_to(home / ".ssh")  # what a cloned repository plants
    gpath = global_config(home, "mounts:\n  - location: data\n    writable: true\n")
    message = refused(
        project, limactl,
        f"{gpath}:2:15: mounts[0].location: data ({gpath.parent / 'data'}, relative to the folder of the file): "
        f"it is inside ~/.config ({home / '.config'})",
    )
    assert str(home / ".ssh") not in message


def test_a_global_relative_location_is_relative_to_the_global_configs_folder(project: Path, home: Path) -> None:
    (home / "datasets").mkdir()
    (project / "datasets").symlink_to(home / ".ssh")  # never looked at
    global_config(home, "mounts:\n  - location: ../../datasets\n    mountPoint: /data\n")
    assert extra_mounts(project) == [{"location": str(home / "datasets"), "mountPoint": "/data", "writable": False,
                                     **READ_ONLY_CACHE}]


def test_a_global_relative_location_under_xdg_config_home(project: Path, home: Path, tmp_path: Path,
                                                          limactl: FakeLima, monkeypatch: pytest.MonkeyPatch) -> None:
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    gpath = write(xdg / "agentbox" / "config.yml", "mounts:\n  - cache\n")
    refused(project, limactl, f"{gpath}:2:5: mounts[0].location: cache ({xdg / 'agentbox' / 'cache'}",
            f"it is inside your config folder (XDG_CONFIG_HOME) ({xdg})")
    (tmp_path / "shared").mkdir()
    write(gpath, "mounts:\n  - ../../shared\n")
    assert [m["location"] for m in extra_mounts(project)] == [str(tmp_path / "shared")]


# -- folders of the home folder that hold logins and keys ----------------------------------------------------------


@pytest.mark.parametrize("where, location, said", [
    ("local", "~/.ssh", "it is ~/.ssh"),
    ("local", "{home}/.aws/sso", "it is inside ~/.aws"),
    ("local", "~/.config/../.kube", "it is ~/.kube"),
    ("global", "~/.gnupg/private-keys-v1.d", "it is inside ~/.gnupg"),
    ("global", "{home}/Library/Keychains", "it is inside ~/Library"),
    ("global", "{outside}/link-to-docker", "it is ~/.docker"),  # the exact folder, but through a link
    ("global", "{home}/.config/agentbox", "it is inside ~/.config"),
])
def test_private_home_folders_are_refused(project: Path, home: Path, limactl: FakeLima, where: str,
                                          location: str, said: str) -> None:
    outside = home.parent / "links"
    outside.mkdir()
    (outside / "link-to-docker").symlink_to(home / ".docker")
    for name in (".ssh", ".aws/sso", ".kube", ".gnupg/private-keys-v1.d", "Library/Keychains", ".docker"):
        (home / name).mkdir(parents=True, exist_ok=True)
    location = location.format(home=home, outside=outside)
    text = f"mounts:\n  - location: {location}\n"
    path = write(project / "agentbox.yml", text) if where == "local" else global_config(home, text)
    exact = where == "local" and location in ("~/.ssh", "~/.config/../.kube")
    message = refused(project, limactl, f"{path}:2:15: mounts[0].location: {location}", said,
                      "which holds logins, keys or the settings of programs on your host")
    if exact:  # named exactly, but by the project: only the global config may
        assert f"Only the global config ({home / '.config' / 'agentbox' / 'config.yml'}) can mount ~/." in message
    else:
        assert "name exactly" in message


@pytest.mark.parametrize("location, folder", [("~/.aws", ".aws"), ("{home}/.ssh", ".ssh"),
                                              ("{home}/Library/", "Library"), ("~/.config", ".config")])
def test_the_global_config_may_name_a_private_folder_exactly(project: Path, home: Path, location: str,
                                                             folder: str) -> None:
    (home / folder).mkdir(exist_ok=True)
    global_config(home, f"mounts:\n  - location: {location.format(home=home)}\n    mountPoint: /mnt/it\n")
    assert extra_mounts(project) == [{"location": str(home / folder), "mountPoint": "/mnt/it", "writable": False,
                                     **READ_ONLY_CACHE}]


def test_the_exactly_named_folder_reaches_the_vm(project: Path, home: Path, limactl: FakeLima) -> None:
    """The control of the refusals above, through `start` against the double: the mount is in the instance."""
    needs_bwrap()
    (home / ".aws").mkdir()
    global_config(home, "mounts:\n  - location: ~/.aws\n    mountPoint: /mnt/aws\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    instance = yaml.safe_load((limactl.home / NAME / "lima.yaml").read_text())
    assert {"location": str(home / ".aws"), "mountPoint": "/mnt/aws", "writable": False, **READ_ONLY_CACHE} \
        in instance["mounts"]


# -- the home folder, agentbox's state folder and LIMA_HOME: never, whatever file names them ------------------


@pytest.mark.parametrize("where", ["local", "global"])
def test_home_state_and_lima_home_are_never_mounted(project: Path, home: Path, isolated_env: dict[str, Path],
                                                    limactl: FakeLima, where: str) -> None:
    state, lima_home = isolated_env["state"], isolated_env["lima_home"]
    (state / "trust").mkdir(parents=True)
    cases = [
        (home, "it is or contains your home folder"),
        (home.parent, "it is or contains your home folder"),
        (state, "it is agentbox's state folder"),
        (state / "trust", "it is inside agentbox's state folder"),
        (lima_home, "it is LIMA_HOME"),
        (lima_home / NAME, "it is inside LIMA_HOME"),
    ]
    for location, said in cases:
        text = f"mounts:\n  - location: {location}\n"
        path = write(project / "agentbox.yml", text) if where == "local" else global_config(home, text)
        refused(project, limactl, f"{path}:2:15: mounts[0].location: {location}: {said}",
                "agentbox never mounts it into a VM")


@pytest.mark.parametrize("where", ["local", "global"])
def test_a_folder_that_contains_the_state_folder_but_not_the_home_is_never_mounted(
        project: Path, home: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """~/.local holds agentbox's state folder where XDG puts it (the trust records, the VMs' broker CAs and
    staging), yet it is neither the home folder nor one of the private folders."""
    state = home / ".local" / "state" / "agentbox"
    if sys.platform == "darwin":  # platformdirs' default there is in ~/Library, a private folder already
        monkeypatch.setenv("AGENTBOX_STATE_DIR", str(state))
    else:
        monkeypatch.delenv("AGENTBOX_STATE_DIR")  # XDG's default
    assert paths.state_dir() == state
    (home / ".local" / "share").mkdir(parents=True)
    text = "mounts:\n  - location: ~/.local\n"
    path = write(project / "agentbox.yml", text) if where == "local" else global_config(home, text)
    said = (f"{path}:2:15: mounts[0].location: ~/.local ({home / '.local'}): it contains agentbox's state folder"
            f" ({state}); agentbox never mounts it into a VM")
    if where == "local":  # the project's file cannot even be trusted with it
        trusting = run_cli("trust", cwd=project)
        assert trusting.exit_code == 2 and said in " ".join(trusting.stderr.split()), trusting.stderr
        assert not (state / "trust").exists()
    refused(project, limactl, said)
    # The control: a folder beside the state folder in ~/.local is mounted.
    text = "mounts:\n  - location: ~/.local/share\n"
    write_trusted(project, text) if where == "local" else global_config(home, text)
    assert [m["location"] for m in extra_mounts(project)] == [str(home / ".local" / "share")]


def test_a_folder_beside_them_is_mounted(project: Path, home: Path, tmp_path: Path) -> None:
    (tmp_path / "datasets").mkdir()
    (home / "datasets").mkdir()
    global_config(home, f"mounts:\n  - location: {tmp_path / 'datasets'}\n  - location: ~/datasets\n")
    assert [m["location"] for m in extra_mounts(project)] == [str(tmp_path / "datasets"), str(home / "datasets")]


# -- a symlink inside the workspace ---------------------------------------------------------------------------


@pytest.mark.parametrize("where, location, link", [
    ("local", "./data", "data"),  # the last component
    ("local", "./sub/link/inner", "sub/link"),  # a component on the way
    ("local", "./sub/to-real/x", "sub/to-real"),  # even a link that stays inside the workspace
    ("global", "{project}/data", "data"),
    ("global", "{outside}/into-workspace", "data"),  # a link of the user's own that leads into one
])
def test_a_symlink_inside_the_workspace_is_refused(project: Path, home: Path, limactl: FakeLima, where: str,
                                                   location: str, link: str) -> None:
    harmless = home.parent / "elsewhere"
    (harmless / "inner").mkdir(parents=True)
    (project / "data").symlink_to(harmless)
    (project / "sub" / "real" / "x").mkdir(parents=True)
    (project / "sub" / "link").symlink_to(harmless)
    (project / "sub" / "to-real").symlink_to("real")
    outside = home.parent / "links"
    outside.mkdir()
    (outside / "into-workspace").symlink_to(project / "data")
    location = location.format(project=project, outside=outside)
    text = f"mounts:\n  - location: {location}\n"
    path = write(project / "agentbox.yml", text) if where == "local" else global_config(home, text)
    refused(project, limactl, f"{path}:2:15: mounts[0].location: {location}",
            f"{project / link} is a symlink inside the workspace ({project}, pointing to",
            "agentbox never follows a link in the workspace for a mount")


def test_real_folders_inside_the_workspace_and_links_outside_it_are_mounted(project: Path, home: Path) -> None:
    (project / "sub" / "real" / "x").mkdir(parents=True)
    (home.parent / "datasets").mkdir()
    (home.parent / "alias").symlink_to(home.parent / "datasets")  # the user's own link, outside the workspace
    write_trusted(project, f"mounts:\n  - location: ./sub/real/x\n    writable: true\n"
                           f"  - location: {home.parent / 'alias'}\n")
    assert [m["location"] for m in extra_mounts(project)] == [str(project / "sub" / "real" / "x"),
                                                             str(home.parent / "datasets")]


def test_every_read_only_mount_asks_lima_for_no_stale_cache(project: Path, limactl: FakeLima) -> None:
    """The staging folder changes at every launch (logins, env, the launch step): over real Lima's 9p with its
    default read-only cache (fscache) the guest kept reading the first launch's env. Writable mounts keep Lima's
    defaults (9p: mmap)."""
    needs_bwrap()
    assert run_cli("start", cwd=project).exit_code == 0
    mounts = yaml.safe_load((limactl.home / NAME / "lima.yaml").read_text())["mounts"]
    read_only = [m for m in mounts if not m["writable"]]
    assert [m["mountPoint"] for m in read_only] == [str(paths.staging_dir(NAME))]
    assert all({k: m.get(k) for k in READ_ONLY_CACHE} == READ_ONLY_CACHE for m in read_only), read_only
    assert all("9p" not in m and "sshfs" not in m for m in mounts if m["writable"]), mounts

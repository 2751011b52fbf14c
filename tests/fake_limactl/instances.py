"""Instances as pkg/store sees them: inspecting an instance directory, its status, and the
objects `limactl list` prints (store.FormatData and the --json keys)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from context import Ctx, go_errno_text, host_arch, new_state, read_state
from gotemplate import GoMap, render_template
from guest import hostname_of
from limayaml import load_config, ram_in_bytes, strip_empty_objects, validate_config
from logrus import LoadError, NotExist, TemplateError, bq


@dataclass
class Instance:
    name: str
    dir: str
    status: str = ""
    raw: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    error_objs: list[Any] = field(default_factory=list)  # how Go's json encodes the errors
    state: dict[str, Any] = field(default_factory=new_state)
    protected: bool = False
    lima_version: str = ""
    has_yaml: bool = True

    @property
    def yaml_path(self) -> str:
        return os.path.join(self.dir, "lima.yaml")

    @property
    def ssh_config(self) -> str:
        return os.path.join(self.dir, "ssh.config")

    def ssh_port(self) -> int:
        if self.config is None:
            return 0
        if self.status == "Running" and self.state.get("sshLocalPort"):
            return int(self.state["sshLocalPort"])
        if self.config["ssh"].get("localPort"):
            return int(self.config["ssh"]["localPort"])
        try:
            with open(self.ssh_config, encoding="utf-8") as f:
                for line in f:
                    if line.strip().startswith("Port "):
                        return int(line.strip()[5:])
        except (OSError, ValueError):
            pass
        return 0


def inspect(ctx: Ctx, name: str) -> Instance:
    """store.Inspect: raises NotExist when lima.yaml is missing, Fatal for an invalid name."""
    inst = Instance(name=name, dir=ctx.inst_dir(name))
    try:
        with open(inst.yaml_path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise NotExist(f"open {inst.yaml_path}: no such file or directory")
    except OSError as e:
        inst.errors.append(f"open {inst.yaml_path}: {go_errno_text(e)}")
        inst.error_objs.append({"Op": "open", "Path": inst.yaml_path, "Err": e.errno})
        return inst
    try:
        inst.raw, cfg = load_config(ctx, data, inst.yaml_path)
        errs = validate_config(cfg, inst.raw, None, False)
        if errs:
            raise LoadError("\n".join(errs))
    except LoadError as e:
        inst.errors.append(str(e))
        inst.error_objs.append({})
        return inst
    inst.config = cfg
    inst.state = read_state(inst.dir)
    inst.status = inst.state.get("status") or "Stopped"
    if inst.status == "Running" and inst.state.get("machine"):
        import machine  # only for a running guest: `list` of stopped instances stays light

        if machine.crashed(inst.state):
            inst.status = "Stopped"
    if inst.status == "Broken":
        errors = inst.state.get("errors") or ["host agent is running but driver is not"]
        inst.errors += errors
        inst.error_objs += [{} for _ in errors]
    inst.protected = os.path.lexists(os.path.join(inst.dir, "protected"))
    try:
        with open(os.path.join(inst.dir, "lima-version"), encoding="utf-8") as f:
            inst.lima_version = f.read().strip()
    except OSError:
        pass
    return inst


def instance_names(ctx: Ctx) -> list[str]:
    try:
        entries = sorted(os.listdir(ctx.lima_home))
    except FileNotFoundError:
        return []
    return [e for e in entries if not e.startswith((".", "_")) and os.path.isdir(os.path.join(ctx.lima_home, e))]


def format_data(ctx: Ctx, inst: Instance) -> dict[str, Any]:
    """store.FormatData as a Go struct (template field names)."""
    cfg = inst.config or {}
    port = inst.ssh_port() if inst.config is not None else 0
    memory = disk = 0
    if inst.config is not None:
        for key in ("memory", "disk"):
            try:
                value = ram_in_bytes(cfg[key])
            except ValueError:
                value = 0
            memory, disk = (value, disk) if key == "memory" else (memory, value)
    data = {
        "Name": inst.name, "Hostname": hostname_of(inst.name) if inst.has_yaml else "",
        "Status": inst.status, "Dir": inst.dir, "VMType": cfg.get("vmType", ""), "Arch": cfg.get("arch", ""),
        "CPUs": cfg.get("cpus", 0), "Memory": memory, "Disk": disk, "Message": "",
        "AdditionalDisks": cfg.get("additionalDisks", []), "Networks": cfg.get("networks", []),
        "SSHLocalPort": port,
        "SSHConfigFile": inst.ssh_config if inst.config is not None else "",
        "HostAgentPID": 0, "DriverPID": 0, "Errors": list(inst.errors), "Config": inst.config,
        "SSHAddress": "127.0.0.1" if inst.config is not None else "", "Protected": inst.protected,
        "LimaVersion": inst.lima_version, "Param": GoMap(cfg.get("param", {})), "AutoStartedIdentifier": "",
        "HostOS": "linux", "HostArch": host_arch(), "LimaHome": ctx.lima_home, "IdentityFile": ctx.identity_file,
    }
    if cfg.get("message"):
        try:
            data["Message"] = render_template(cfg["message"], data)
        except TemplateError as e:
            inst.errors.append(f"cannot execute template {bq(cfg['message'])}: {e}")
            inst.status = data["Status"] = "Broken"
    return data


def instance_json(ctx: Ctx, inst: Instance) -> dict[str, Any]:
    fd = format_data(ctx, inst)
    obj: dict[str, Any] = {"name": fd["Name"], "hostname": fd["Hostname"], "status": fd["Status"], "dir": fd["Dir"],
                           "vmType": fd["VMType"], "arch": fd["Arch"]}
    optional = [("cpus", fd["CPUs"]), ("memory", fd["Memory"]), ("disk", fd["Disk"]), ("message", fd["Message"]),
                ("additionalDisks", fd["AdditionalDisks"]), ("network", fd["Networks"]),
                ("sshLocalPort", fd["SSHLocalPort"]), ("sshConfigFile", fd["SSHConfigFile"]),
                ("errors", inst.error_objs), ("config", inst.config), ("sshAddress", fd["SSHAddress"])]
    obj.update((k, v) for k, v in optional if v)
    obj["protected"] = fd["Protected"]
    obj["limaVersion"] = fd["LimaVersion"]
    if fd["Param"]:
        obj["param"] = dict(fd["Param"])
    obj.update(HostOS=fd["HostOS"], HostArch=fd["HostArch"], LimaHome=fd["LimaHome"], IdentityFile=fd["IdentityFile"])
    return strip_empty_objects(obj)

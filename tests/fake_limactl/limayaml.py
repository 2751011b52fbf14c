"""lima.yaml as Lima loads it on every command (pkg/limayaml): merging _config/default.yaml and
override.yaml, filling defaults (FillDefault), template variables, validation, and (for create
and validate only) tests/lima_schema.json."""

from __future__ import annotations

import copy
import getpass
import hashlib
import json
import os
import posixpath
import pwd
import re
import stat
from dataclasses import dataclass
from typing import Any

from constants import (
    ARCH_TYPES,
    CONFIG_ORDER,
    OS_TYPES,
    PARAM_NAME_RE,
    PORT_FORWARD_ORDER,
    PROVISION_ORDER,
    SCHEMA_PATH,
    SYSTEM_MOUNT_POINTS,
    USERNAME_RE,
    VERSION,
    VM_TYPES,
)
from context import Ctx, go_errno_text, host_arch, host_home
from gotemplate import GoMap, render_template
from goyaml import go_str, parse_yaml, to_plain
from guest import hostname_of
from logrus import LoadError, Logger, TemplateError, bq, go_quote


def _dict(m: Any, key: str) -> dict[str, Any]:
    v = m.get(key) if isinstance(m, dict) else None
    return v if isinstance(v, dict) else {}


def _list(m: Any, key: str) -> list[Any]:
    v = m.get(key) if isinstance(m, dict) else None
    return copy.deepcopy(v) if isinstance(v, list) else []


def _pick(key: str, o: dict[str, Any], y: dict[str, Any], d: dict[str, Any]) -> Any:
    """Scalar precedence of FillDefault: override > lima.yaml > default.yaml."""
    for src in (o, y, d):
        v = src.get(key)
        if v is not None:
            return v
    return None


def _pick_bool(key: str, o: dict[str, Any], y: dict[str, Any], d: dict[str, Any], default: bool) -> bool:
    v = _pick(key, o, y, d)
    return bool(v) if v is not None else default


def _str_map(*maps: Any) -> GoMap:
    out = GoMap()
    for m in maps:
        if isinstance(m, dict):
            for k, v in m.items():
                out[str(k)] = go_str(v)
    return out


_SIZE_UNITS = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4, "p": 1024 ** 5}


def ram_in_bytes(size: str) -> int:
    """go-units RAMInBytes: binary multiples; a bare number means bytes."""
    sep = max(size.rfind(c) for c in "0123456789. ")
    if sep == -1:
        raise ValueError(f"invalid size: '{size}'")
    num, sfx = (size[:sep + 1], size[sep + 1:]) if size[sep] != " " else (size[:sep], size[sep + 1:])
    if not re.fullmatch(r"[0-9]*\.?[0-9]+|[0-9]+\.", num):
        raise ValueError(f"strconv.ParseFloat: parsing {go_quote(num)}: invalid syntax")
    value = float(num)
    low = sfx.lower()
    if not low or low == "b":
        return int(value)
    if len(low) <= 3 and low[0] in _SIZE_UNITS and low[1:] in ("", "i", "b", "ib"):
        return int(value * _SIZE_UNITS[low[0]])
    raise ValueError(f"invalid suffix: '{low}'")


def bytes_size(n: float) -> str:
    """go-units BytesSize ("%.4g" + binary unit)."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"]
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return "%.4g%s" % (n, units[i])


def host_timezone() -> str:
    try:
        with open("/etc/timezone", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        pass
    try:
        zone = os.path.realpath("/etc/localtime")
    except OSError:
        return ""
    base = os.path.dirname(zone)
    while base not in ("/", ""):
        if os.path.exists(os.path.join(base, "Etc/UTC")):
            return zone[len(base) + 1:]
        base = os.path.dirname(base)
    return ""


# Real limactl refuses to run as root. Run as root, the double behaves as if an unprivileged
# user ran it: the guest user is `lima` (Lima's own fallback name) with this uid, never root.
ROOT_HOST_GUEST_UID = 1000


def default_guest_user(log: Logger | None) -> str:
    if os.geteuid() == 0:
        return "lima"
    name = getpass.getuser()
    if not USERNAME_RE.fullmatch(name):
        if log:
            log.warn(f"local username {bq(name)} is not a valid Linux username (must match "
                     f"{bq(USERNAME_RE.pattern)}); using `lima` instead")
        return "lima"
    if name == "admin":
        if log:
            log.warn("local username `admin` is reserved; using `lima` instead")
        return "lima"
    return name


def host_gecos() -> str:
    if os.geteuid() == 0:
        return "lima"
    try:
        return pwd.getpwuid(os.getuid()).pw_gecos.split(",")[0]
    except KeyError:
        return ""


def version_tuple(v: str) -> tuple[int, int, int, int] | None:
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(\+.*)?", v.strip())
    if not m:
        return None
    return int(m[1]), int(m[2]), int(m[3]), 0 if m[4] else 1


def expand_tilde(path: str) -> str:
    if path == "~" or path.startswith("~/"):
        return host_home() + path[1:]
    return path


def clean_path(path: str) -> str:
    """Go's filepath.Clean (posixpath.normpath keeps a leading "//")."""
    if not path:
        return "."
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def machine_id() -> str:
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(p, encoding="utf-8") as f:
                return f.read().strip()
        except OSError:
            continue
    return ""


@dataclass
class TemplateVars:
    guest: dict[str, Any]
    host: dict[str, Any]


def _render_or_keep(text: str, data: dict[str, Any], what: str, log: Logger | None) -> str:
    try:
        return render_template(text, data)
    except TemplateError as e:
        if log:
            log.warn(f"Couldn't process {what} {bq(text)} as a template", error=str(e))
        return text


def fill_defaults(y: dict[str, Any], d: dict[str, Any], o: dict[str, Any], inst_dir: str,
                  log: Logger | None, warn: bool) -> dict[str, Any]:
    """FillDefault of pkg/limayaml/defaults.go (the parts that matter for a test double)."""
    name = os.path.basename(inst_dir)
    cfg: dict[str, Any] = {}
    os_name = go_str(_pick("os", o, y, d) or "")
    cfg["os"] = "Linux" if os_name in ("", "default") else os_name
    own_param = _str_map(y.get("param"))
    user = _fill_user(y, d, o, inst_dir, own_param, log if warn else None)
    cfg["user"] = user
    tv = TemplateVars(
        guest={"Name": name, "Hostname": hostname_of(name), "UID": user["uid"], "User": user["name"],
               "Home": user["home"], "Param": own_param},
        host={"Home": host_home(), "Name": name, "Instance": name, "Dir": inst_dir,
              "LimaHome": os.path.dirname(inst_dir), "User": getpass.getuser(), "UID": os.getuid(),
              "Param": own_param, "GlobalTempDir": "/tmp", "TempDir": os.environ.get("TMPDIR") or "/tmp"})

    cfg["vmType"] = go_str(_pick("vmType", o, y, d) or "qemu")
    arch = go_str(_pick("arch", o, y, d) or "")
    cfg["arch"] = host_arch() if arch in ("", "default") else arch
    cfg["images"] = [_fill_image(img, cfg["arch"]) for img in
                     _list(o, "images") + _list(y, "images") + _list(d, "images")]
    cpus = _pick("cpus", o, y, d)
    cfg["cpus"] = int(cpus) if cpus else 4
    cfg["memory"] = go_str(_pick("memory", o, y, d)) or "4GiB"
    cfg["disk"] = go_str(_pick("disk", o, y, d)) or "100GiB"
    cfg["additionalDisks"] = [{"name": go_str(x)} if not isinstance(x, dict) else x for x in
                              _list(o, "additionalDisks") + _list(y, "additionalDisks") + _list(d, "additionalDisks")]
    for key in ("minimumLimaVersion", "cpuType", "rosetta"):
        if y.get(key) is not None:
            cfg[key] = copy.deepcopy(y[key])
    cfg["audio"] = {k: go_str(_pick(k, _dict(o, "audio"), _dict(y, "audio"), _dict(d, "audio")) or "")
                    for k in ("device", "interface")}
    video = {"display": go_str(_pick("display", _dict(o, "video"), _dict(y, "video"), _dict(d, "video"))) or "none"}
    vnc = _pick("display", *(_dict(_dict(m, "video"), "vnc") for m in (o, y, d)))
    if vnc is not None:
        video["vnc"] = {"display": go_str(vnc)}
    cfg["video"] = video
    cfg["firmware"] = {
        "legacyBIOS": _pick_bool("legacyBIOS", _dict(o, "firmware"), _dict(y, "firmware"), _dict(d, "firmware"), False),
        "images": [_fill_image(i, cfg["arch"]) for i in
                   _list(_dict(o, "firmware"), "images") + _list(_dict(y, "firmware"), "images")
                   + _list(_dict(d, "firmware"), "images")]}
    tz = _pick("timezone", o, y, d)
    cfg["timezone"] = go_str(tz) if tz is not None else host_timezone()
    cfg["ssh"] = _fill_ssh(o, y, d)
    hr = [_dict(m, "hostResolver") for m in (o, y, d)]
    cfg["hostResolver"] = {"enabled": _pick_bool("enabled", *hr, True), "ipv6": _pick_bool("ipv6", *hr, False),
                           "hosts": _str_map(*(_dict(m, "hosts") for m in reversed(hr)))}
    cfg["provision"] = [_fill_provision(p, cfg["os"], tv, log) for p in
                        _list(o, "provision") + _list(y, "provision") + _list(d, "provision")]
    cfg["guestInstallPrefix"] = go_str(_pick("guestInstallPrefix", o, y, d) or "/usr/local")
    cfg["upgradePackages"] = _pick_bool("upgradePackages", o, y, d, False)
    containerd_user_default = cfg["os"] == "Linux" and cfg["arch"] in ("x86_64", "aarch64")
    cd = [_dict(m, "containerd") for m in (o, y, d)]
    cfg["containerd"] = {"system": _pick_bool("system", *cd, False),
                         "user": _pick_bool("user", *cd, containerd_user_default),
                         "archives": _list(cd[0], "archives") + _list(cd[1], "archives") + _list(cd[2], "archives")}
    probes = _list(o, "probes") + _list(y, "probes") + _list(d, "probes")
    cfg["probes"] = [_fill_probe(p, i, len(probes), tv, log) for i, p in enumerate(probes)]
    cfg["portForwards"] = [_fill_port_forward(p, inst_dir, tv, log) for p in
                           _list(o, "portForwards") + _list(y, "portForwards") + _list(d, "portForwards")]
    cfg["copyToHost"] = [_fill_copy_to_host(c, tv, log) for c in
                         _list(o, "copyToHost") + _list(y, "copyToHost") + _list(d, "copyToHost")]
    message = _pick("message", o, y, d)
    if message:
        cfg["message"] = go_str(message)
    cfg["propagateProxyEnv"] = _pick_bool("propagateProxyEnv", o, y, d, True)
    cfg["networks"] = _fill_networks(d, y, o, os.path.join(inst_dir, "lima.yaml"))
    cfg["mountTypesUnsupported"] = [go_str(x) for x in _list(o, "mountTypesUnsupported")
                                    + _list(y, "mountTypesUnsupported") + _list(d, "mountTypesUnsupported")]
    cfg["mountType"] = go_str(_pick("mountType", o, y, d) or _default_mount_type(cfg))
    cfg["mountInotify"] = _pick_bool("mountInotify", o, y, d, False)
    cfg["mounts"] = _fill_mounts(d, y, o, tv, log)
    dns = next((_list(m, "dns") for m in (o, y, d) if _list(m, "dns")), [])
    cfg["dns"] = [go_str(x) for x in dns]
    cfg["env"] = _str_map(d.get("env"), y.get("env"), o.get("env"))
    cfg["param"] = _str_map(d.get("param"), y.get("param"), o.get("param"))
    cfg["vmOpts"] = {**_dict(d, "vmOpts"), **_dict(y, "vmOpts"), **_dict(o, "vmOpts")}
    cfg["osOpts"] = {**_dict(d, "osOpts"), **_dict(y, "osOpts"), **_dict(o, "osOpts")}
    ca = [_dict(m, "caCerts") for m in (o, y, d)]
    cfg["caCerts"] = {"removeDefaults": _pick_bool("removeDefaults", *ca, False),
                      "files": _unique(_list(ca[2], "files") + _list(ca[1], "files") + _list(ca[0], "files")),
                      "certs": _unique(_list(ca[2], "certs") + _list(ca[1], "certs") + _list(ca[0], "certs"))}
    for key in ("nestedVirtualization", "plain", "tpm"):
        cfg[key] = _pick_bool(key, o, y, d, False)
    if cfg["plain"]:
        cfg["mounts"] = []
        cfg["containerd"].update(system=False, user=False)
        cfg["portForwards"] = [p for p in cfg["portForwards"] if p.get("static")]
    ordered = {k: cfg[k] for k in CONFIG_ORDER if k in cfg}
    return prune_config(to_plain(ordered))


def _unique(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def _default_mount_type(cfg: dict[str, Any]) -> str:
    vm = cfg["vmType"]
    if vm in ("vz", "krunkit"):
        return "virtiofs"
    if vm == "wsl2":
        return "wsl2"
    return "reverse-sshfs" if "9p" in cfg["mountTypesUnsupported"] else "9p"


def _fill_user(y: dict[str, Any], d: dict[str, Any], o: dict[str, Any], inst_dir: str,
               param: GoMap, log: Logger | None) -> dict[str, Any]:
    yu, du, ou = _dict(y, "user"), _dict(d, "user"), _dict(o, "user")
    name = _pick("name", ou, yu, du)
    name = go_str(name) if name is not None else default_guest_user(log)
    comment = _pick("comment", ou, yu, du)
    home = _pick("home", ou, yu, du)
    if home is None:
        created_by = ""
        try:
            with open(os.path.join(inst_dir, "lima-version"), encoding="utf-8") as f:
                created_by = f.read().strip()
        except OSError:
            created_by = VERSION
        vt = version_tuple(created_by)
        old = created_by == "" or (vt is not None and vt < (2, 1, 0, 0))
        home = "/home/{{.User}}.linux" if old else "/home/{{.User}}.guest"
    uid = _pick("uid", ou, yu, du)
    uid = int(uid) if uid is not None else (os.getuid() or ROOT_HOST_GUEST_UID)
    inst_name = os.path.basename(inst_dir)
    data = {"Name": inst_name, "Hostname": hostname_of(inst_name), "UID": uid, "User": name,
            "Home": go_str(home), "Param": param}
    return {
        "name": name,
        "comment": go_str(comment) if comment is not None else host_gecos(),
        "home": _render_or_keep(go_str(home), data, "`user.home` value", log),
        "shell": go_str(_pick("shell", ou, yu, du) or "/bin/bash"),
        "uid": uid,
        "passwordlessSudo": _pick_bool("passwordlessSudo", ou, yu, du, True),
    }


def _fill_image(img: Any, arch: str) -> Any:
    if not isinstance(img, dict):
        return img
    img = dict(img)
    img["arch"] = img.get("arch") or arch
    for sub in ("kernel", "initrd"):
        if isinstance(img.get(sub), dict) and not img[sub].get("arch"):
            img[sub] = dict(img[sub], arch=img["arch"])
    return img


def _fill_ssh(o: dict[str, Any], y: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    s = [_dict(m, "ssh") for m in (o, y, d)]
    port = _pick("localPort", *s)
    ssh = {"localPort": int(port) if port is not None else 0}
    for key in ("loadDotSSHPubKeys", "forwardAgent", "forwardX11", "forwardX11Trusted", "overVsock"):
        ssh[key] = _pick_bool(key, *s, False)
    return ssh


def _fill_provision(p: Any, os_name: str, tv: TemplateVars, log: Logger | None) -> dict[str, Any]:
    p = {k: (go_str(v) if k in ("script", "content", "owner", "path", "permissions", "expression", "format", "mode")
                            and v is not None else v) for k, v in (p if isinstance(p, dict) else {}).items()}
    mode = p.get("mode") or "system"
    p["mode"] = mode
    if mode == "dependency" and p.get("skipDefaultDependencyResolution") is None:
        p["skipDefaultDependencyResolution"] = False
    if mode == "data":
        content = p.get("content")
        p["content"] = _render_or_keep(content, tv.guest, "data content", log) if content is not None else ""
        if p.get("overwrite") is None:
            p["overwrite"] = True
    if mode == "yq":
        if p.get("expression") is not None:
            p["expression"] = _render_or_keep(p["expression"], tv.guest, "expression", log)
        p.setdefault("format", "auto")
    if mode in ("data", "yq"):
        if p.get("owner") is None:
            p["owner"] = "root:wheel" if os_name in ("Darwin", "FreeBSD") else "root:root"
        else:
            p["owner"] = _render_or_keep(p["owner"], tv.guest, "owner", log)
        if p.get("path") is not None:
            p["path"] = _render_or_keep(p["path"], tv.guest, "path", log)
        if p.get("permissions") is None:
            p["permissions"] = "644"
    script = p.get("script") or ""
    p["script"] = _render_or_keep(script, tv.guest, "provisioning script", log) if script else ""
    return {k: p[k] for k in PROVISION_ORDER if k in p}


def _fill_probe(p: Any, i: int, n: int, tv: TemplateVars, log: Logger | None) -> dict[str, Any]:
    p = dict(p) if isinstance(p, dict) else {}
    out = {"mode": p.get("mode") or "readiness", "description": p.get("description") or f"user probe {i + 1}/{n}",
           "script": _render_or_keep(go_str(p.get("script")), tv.guest, "probing script", log)}
    for key in ("file", "hint"):
        if p.get(key):
            out[key] = p[key]
    return out


def _fill_port_forward(p: Any, inst_dir: str, tv: TemplateVars, log: Logger | None) -> dict[str, Any]:
    r = dict(p) if isinstance(p, dict) else {}
    r["proto"] = r.get("proto") or "any"
    must_be_zero = r.get("guestIPMustBeZero")
    if r.get("guestIP") is None:
        r["guestIP"] = "0.0.0.0" if must_be_zero else "127.0.0.1"
    if must_be_zero is None:
        r["guestIPMustBeZero"] = r["guestIP"] == "0.0.0.0"
    r.setdefault("hostIP", "127.0.0.1")
    gp, hp = int(r.get("guestPort") or 0), int(r.get("hostPort") or 0)
    if not r.get("guestPortRange") or list(r["guestPortRange"]) == [0, 0]:
        r["guestPortRange"] = [1, 65535] if gp == 0 else [gp, gp]
    if r.get("guestSocket"):
        r["guestSocket"] = _render_or_keep(go_str(r["guestSocket"]), tv.guest, "guestSocket", log)
    if r.get("hostSocket"):
        hs = _render_or_keep(go_str(r["hostSocket"]), tv.host, "hostSocket", log)
        r["hostSocket"] = hs if hs.startswith("/") else os.path.join(inst_dir, "sock", hs)
    elif not r.get("hostPortRange") or list(r["hostPortRange"]) == [0, 0]:
        r["hostPortRange"] = list(r["guestPortRange"]) if hp == 0 else [hp, hp]
    for key in ("guestPort", "hostPort"):
        if not r.get(key):
            r.pop(key, None)
    for key in ("reverse", "ignore", "static"):
        if not r.get(key):
            r.pop(key, None)
    return {k: r[k] for k in PORT_FORWARD_ORDER if k in r}


def _fill_copy_to_host(c: Any, tv: TemplateVars, log: Logger | None) -> dict[str, Any]:
    c = dict(c) if isinstance(c, dict) else {}
    if c.get("guest"):
        c["guest"] = _render_or_keep(go_str(c["guest"]), tv.guest, "guest", log)
    if c.get("host"):
        c["host"] = _render_or_keep(go_str(c["host"]), tv.host, "host", log)
    return c


def _fill_networks(d: dict[str, Any], y: dict[str, Any], o: dict[str, Any], file_path: str) -> list[dict[str, Any]]:
    nets: list[dict[str, Any]] = []
    by_iface: dict[str, int] = {}
    for nw in _list(d, "networks") + _list(y, "networks") + _list(o, "networks"):
        nw = dict(nw) if isinstance(nw, dict) else {}
        iface = nw.get("interface") or ""
        if iface and iface in by_iface:
            cur = nets[by_iface[iface]]
            cur.update({k: v for k, v in nw.items() if v not in (None, "")})
            continue
        if iface:
            by_iface[iface] = len(nets)
        nets.append(nw)
    for i, nw in enumerate(nets):
        if not nw.get("macAddress"):
            sha = hashlib.sha256((machine_id() + f"{file_path}#{i}").encode()).digest()
            nw["macAddress"] = "52:55:55:" + ":".join("%02x" % b for b in sha[:3])
        nw.setdefault("interface", f"lima{i}")
        if not nw["interface"]:
            nw["interface"] = f"lima{i}"
        if nw.get("metric") is None:
            nw["metric"] = 100
    return nets


def _fill_mounts(d: dict[str, Any], y: dict[str, Any], o: dict[str, Any], tv: TemplateVars,
                 log: Logger | None) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = []
    by_point: dict[str, int] = {}
    for m in _list(d, "mounts") + _list(y, "mounts") + _list(o, "mounts"):
        m = dict(m) if isinstance(m, dict) else {}
        loc = clean_path(_render_or_keep(go_str(m.get("location")), tv.host, "mount location", log))
        m["location"] = expand_tilde(loc)
        mp = m.get("mountPoint")
        mp = m["location"] if mp is None else _render_or_keep(go_str(mp), tv.guest, "mount point", log)
        m["mountPoint"] = mp
        if mp in by_point:
            cur = mounts[by_point[mp]]
            for sub in ("sshfs", "9p", "virtiofs"):
                for k, v in _dict(m, sub).items():
                    if v is not None:
                        cur.setdefault(sub, {})[k] = v
            if m.get("writable") is not None:
                cur["writable"] = m["writable"]
            continue
        by_point[mp] = len(mounts)
        mounts.append({"location": m["location"], "mountPoint": mp, "writable": m.get("writable"),
                       "sshfs": dict(_dict(m, "sshfs")), "9p": dict(_dict(m, "9p")),
                       "virtiofs": dict(_dict(m, "virtiofs"))})
    for m in mounts:
        m["writable"] = bool(m["writable"]) if m["writable"] is not None else False
        sshfs, ninep = m["sshfs"], m["9p"]
        for k, v in (("cache", True), ("followSymlinks", False), ("sftpDriver", "")):
            if sshfs.get(k) is None:
                sshfs[k] = v
        for k, v in (("securityModel", "none"), ("protocolVersion", "9p2000.L"), ("msize", "128KiB"),
                     ("cache", "mmap" if m["writable"] else "fscache")):
            if ninep.get(k) is None:
                ninep[k] = v
        m["sshfs"] = {k: sshfs[k] for k in ("cache", "followSymlinks", "sftpDriver")}
        m["9p"] = {k: go_str(ninep[k]) for k in ("securityModel", "protocolVersion", "msize", "cache")}
    return mounts


def prune_config(v: Any) -> Any:
    """Go's omitempty for the config: drop nil, empty slices and empty maps."""
    if isinstance(v, dict):
        out = type(v)() if isinstance(v, GoMap) else {}
        for k, x in v.items():
            x = prune_config(x)
            if x is None or (isinstance(x, (list, dict)) and not x):
                continue
            out[k] = x
        return out
    if isinstance(v, list):
        return [prune_config(x) for x in v]
    return v


def strip_empty_objects(v: Any) -> Any:
    """yq's `del(.. | select(tag == "!!map" and length == 0))`, repeated until stable."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            x = strip_empty_objects(x)
            if isinstance(x, dict) and not x:
                continue
            out[k] = x
        return out
    if isinstance(v, list):
        items = [strip_empty_objects(x) for x in v]
        return [x for x in items if not (isinstance(x, dict) and not x)]
    return v


def check_param_used(y: dict[str, Any]) -> None:
    """validateParamIsUsed: every `param` key must be referenced somewhere."""
    params = y.get("param")
    if not isinstance(params, dict):
        return
    texts: list[str] = []
    for p in _list(y, "provision"):
        if isinstance(p, dict):
            texts += [go_str(p[k]) for k in ("script", "content", "expression", "owner", "path", "permissions")
                      if p.get(k) is not None and not isinstance(p[k], (dict, list))]
    texts += [go_str(p.get("script")) for p in _list(y, "probes") if isinstance(p, dict) and p.get("script")]
    for c in _list(y, "copyToHost"):
        if isinstance(c, dict):
            texts += [go_str(c.get("guest")), go_str(c.get("host"))]
    for p in _list(y, "portForwards"):
        if isinstance(p, dict):
            texts += [go_str(p.get("guestSocket")), go_str(p.get("hostSocket"))]
    for m in _list(y, "mounts"):
        if isinstance(m, dict):
            texts += [go_str(m.get("location")), go_str(m.get("mountPoint"))]
    for key in params:
        key = str(key)
        if key == "internal_netplanOptional":
            continue
        try:
            rx = re.compile(r"{{[^}]*\.Param\." + key + r"[^}]*}}|\bPARAM_" + key + r"\b", re.ASCII)
        except re.error as e:
            raise LoadError(f"field to compile regexp for key {bq(key)}: {e}")
        if not any(rx.search(t) for t in texts):
            raise LoadError(f"field `param` key {bq(key)} is not used in any provision, probe, copyToHost, "
                            "or portForward")


def validate_config(cfg: dict[str, Any], raw: dict[str, Any], log: Logger | None, warn: bool) -> list[str]:
    """pkg/limayaml/validate.go Validate(): returns the error texts (joined with \\n by callers)."""
    errs: list[str] = []
    mlv = cfg.get("minimumLimaVersion")
    if mlv is not None:
        want, have = version_tuple(go_str(mlv)), version_tuple(VERSION)
        if want is None:
            errs.append(f"field `minimumLimaVersion` must be a semvar value, got {bq(go_str(mlv))}: "
                        f"{go_str(mlv)} is not in dotted-tri format")
        elif have is not None and want > have:
            errs.append(f"template requires Lima version {bq(go_str(mlv))}; this is only {bq(VERSION)}")
    if cfg["vmType"] not in VM_TYPES:
        errs.append(f"vmType {bq(cfg['vmType'])} is not a registered driver")
    if cfg["os"] not in OS_TYPES:
        errs.append(f"field `os` must be one of [{' '.join(map(bq, OS_TYPES))}]; got {bq(cfg['os'])}")
    if cfg["arch"] not in ARCH_TYPES:
        errs.append(f"field `arch` must be one of [{' '.join(ARCH_TYPES)}]; got {bq(cfg['arch'])}")
    shell = cfg["user"].get("shell", "")
    if not shell.startswith("/"):
        errs.append(f"field `user.shell` must be an absolute path, got {bq(shell)}")
    if not cfg.get("images") and raw.get("base") is None:
        errs.append("field `images` must be set")
    for i, img in enumerate(cfg.get("images", [])):
        if not isinstance(img, dict):
            continue
        errs += _validate_file_object(img, f"images[{i}]")
        for sub in ("kernel", "initrd"):
            part = img.get(sub)
            if isinstance(part, dict):
                errs += _validate_file_object(part, f"images[{i}].{sub}")
                if part.get("arch") != img.get("arch"):
                    errs.append(f"images[{i}].{sub} has unexpected architecture {bq(go_str(part.get('arch')))}, "
                                f"must be {bq(go_str(img.get('arch')))}")
    for key in ("memory", "disk"):
        try:
            ram_in_bytes(cfg[key])
        except ValueError as e:
            errs.append(f"field `{key}` has an invalid value: {e}")
    errs += _validate_mounts(cfg, log, warn)
    port = cfg["ssh"].get("localPort", 0)
    if port:
        err = _port_error("ssh.localPort", port)
        if err:
            errs.append(err)
    if cfg["mountType"] not in ("reverse-sshfs", "9p", "virtiofs", "wsl2"):
        errs.append("field `mountType` must be `reverse-sshfs` or `9p` or `virtiofs`, or `wsl2`, "
                    f"got {bq(cfg['mountType'])}")
    errs += _validate_provision(cfg, log)
    for i, p in enumerate(cfg.get("probes", [])):
        if p.get("script") and not p["script"].startswith("#!"):
            errs.append(f"field `probe[{i}].script` must start with a '#!' line")
        if p.get("mode") != "readiness":
            errs.append(f"field `probe[{i}].mode` can only be `readiness`")
    if cfg["hostResolver"].get("enabled") and cfg.get("dns"):
        errs.append("field `dns` must be empty when field `HostResolver.Enabled` is true")
    for key, value in cfg.get("param", {}).items():
        if not PARAM_NAME_RE.fullmatch(key):
            errs.append(f"param {bq(key)} name does not match regex {bq(PARAM_NAME_RE.pattern)}")
        bad = next((ch for ch in value if not ch.isprintable() and ch not in "\t "), None)
        if bad is not None:
            errs.append(f"param {bq(key)} value contains unprintable character {bq(bad)}")
    if not cfg["user"].get("passwordlessSudo", True) and not cfg.get("plain"):
        errs.append("`user.passwordlessSudo: false` requires `plain: true`")
    return errs


def _validate_file_object(f: dict[str, Any], field: str) -> list[str]:
    """pkg/limayaml/validate.go validateFileObject: a local location must expand, but need not exist."""
    errs: list[str] = []
    loc = go_str(f.get("location"))
    if "://" not in loc:
        problem = "empty path" if loc == "" else (
            f"unexpandable path {bq(loc)}" if loc.startswith("~") and not (loc == "~" or loc.startswith("~/"))
            else None)
        if problem:
            errs.append(f"field `{field}.location` refers to an invalid local file path: {bq(loc)}: {problem}")
    if f.get("arch") not in ARCH_TYPES:
        errs.append(f"field `arch` must be one of [{' '.join(ARCH_TYPES)}]; got {bq(go_str(f.get('arch')))}")
    # The digest check (go-digest's Validate) is not here: the schema check before it refuses any digest it would.
    return errs


def _port_error(name: str, port: int) -> str | None:
    if port < 0:
        return f"field `{name}` must be > 0"
    if port == 22:
        return f"field `{name}` must not be 22"
    if port > 65535:
        return f"field `{name}` must be < 65536"
    return None


def _validate_mounts(cfg: dict[str, Any], log: Logger | None, warn: bool) -> list[str]:
    errs: list[str] = []
    for i, m in enumerate(cfg.get("mounts", [])):
        loc = m["location"]
        if not loc.startswith("/") and not loc.startswith("~"):
            errs.append(f"field `mounts[{i}].location` must be an absolute path, got {bq(loc)}")
        if loc.startswith("~") and not (loc == "~" or loc.startswith("~/")):
            errs.append(f"field `mounts[{i}].location` refers to an unexpandable path: {bq(loc)}: "
                        f"unexpandable path {bq(loc)}")
        try:
            st = os.stat(loc)
        except FileNotFoundError:
            if warn and log:
                log.warn(f"field `mounts[{i}].location` refers to a non-existent directory: {bq(loc)}:")
        except OSError as e:
            errs.append(f"field `mounts[{i}].location` refers to an inaccessible path: {bq(loc)}: "
                        f"stat {loc}: {go_errno_text(e)}")
        else:
            if not stat.S_ISDIR(st.st_mode):
                # Lima formats a nil error with %w here, hence the odd suffix.
                errs.append(f"field `mounts[{i}].location` refers to a non-directory path: {bq(loc)}: %!w(<nil>)")
        mp = m["mountPoint"]
        if mp in SYSTEM_MOUNT_POINTS:
            errs.append(f"field `mounts[{i}].mountPoint` must not be a system path such as /etc or /usr")
        elif mp == cfg["user"]["home"]:
            errs.append(f"field `mounts[{i}].mountPoint` is the reserved internal home directory {bq(mp)}")
        if mp.startswith("~"):
            errs.append(f"field `mounts[{i}].mountPoint` must not start with `~`")
        try:
            ram_in_bytes(m["9p"]["msize"])
        except ValueError as e:
            errs.append(f"field `msize` has an invalid value: {e}")
    return errs


def _validate_provision(cfg: dict[str, Any], log: Logger | None) -> list[str]:
    errs: list[str] = []
    modes = ("system", "user", "boot", "data", "dependency", "ansible", "yq")
    for i, p in enumerate(cfg.get("provision", [])):
        mode = p.get("mode")
        if mode not in modes:
            errs.append(f"field `provision[{i}].mode` must one of `system`, `user`, `boot`, `data`, "
                        f"`dependency`, `ansible`, or `yq`")
        if mode != "dependency" and p.get("skipDefaultDependencyResolution") is not None:
            errs.append(f"field `provision[{i}].mode` cannot set skipDefaultDependencyResolution, "
                        f"only valid on scripts of type `dependency`")
        if mode in ("data", "yq"):
            if p.get("path") is None:
                errs.append(f"field `provision[{i}].path` must not be empty when mode is {bq(mode)}")
                return errs
            if not p["path"].startswith("/"):
                errs.append(f"field `provision[{i}].path` must be an absolute path")
            if mode == "yq" and p.get("expression") is None:
                errs.append(f"field `provision[{i}].expression` must not be empty when mode is `yq`")
            if not re.fullmatch(r"[+-]?(0[oO])?[0-7]+", p.get("permissions", "")):
                errs.append(f"field `provision[{i}].permissions` must be an octal number: strconv.ParseInt: "
                            f"parsing {go_quote(p.get('permissions', ''))}: invalid syntax")
            continue
        if not p.get("script") and mode != "ansible":
            errs.append(f"field `provision[{i}].script` must not be empty")
        for key, allowed in (("content", "`data`"), ("overwrite", "`data`"), ("owner", "`data`"),
                             ("path", "`data`, or `yq`"), ("permissions", "`data`, or `yq`"), ("format", "`yq`")):
            if p.get(key) is not None:
                errs.append(f"field `provision[{i}].{key}` can only be set when mode is {allowed}")
        if "LIMA_CIDATA" in p.get("script", "") and log:
            log.warn("provisioning scripts should not reference the LIMA_CIDATA variables")
    return errs


def schema_errors(raw: dict[str, Any]) -> list[str]:
    """Validate the user's YAML against tests/lima_schema.json (stricter than Lima, on purpose)."""
    if not os.path.exists(SCHEMA_PATH):
        return []
    try:
        import jsonschema
    except ImportError:
        return []
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        schema = json.load(f)
    validator = jsonschema.Draft202012Validator(schema)
    errs = []
    for e in sorted(validator.iter_errors(to_plain(raw)), key=lambda e: [str(p) for p in e.absolute_path]):
        e = _most_specific(e, jsonschema)
        path = _json_path(list(e.absolute_path))
        if e.validator == "additionalProperties":
            allowed = set((e.schema or {}).get("properties", {}))
            for key in [k for k in e.instance if k not in allowed]:
                errs.append(f"field `{_json_path(list(e.absolute_path) + [key])}` is not a known field "
                            f"(unknown field {go_quote(str(key))})")
        else:
            errs.append(f"field `{path or '.'}` is invalid: {e.message}")
    return errs


def _most_specific(e: Any, jsonschema: Any) -> Any:
    """For `anyOf: [Struct, null]` report why Struct failed, not "not valid under any schema"."""
    while e.context:
        useful = [c for c in e.context if not (c.validator == "type" and c.validator_value == "null")]
        e = jsonschema.exceptions.best_match(useful or e.context)
    return e


def _json_path(parts: list[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (("." if out else "") + str(p))
    return out


def load_aux_config(ctx: Ctx, filename: str, what: str) -> dict[str, Any]:
    path = os.path.join(ctx.lima_home, "_config", filename)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise LoadError(f"open {path}: {go_errno_text(e)}")
    return parse_yaml(data, f"{what} file {bq(path)}")


class SchemaError(LoadError):
    """The YAML does not match tests/lima_schema.json (checked by create/validate only)."""


def load_config(ctx: Ctx, data: bytes, yaml_path: str, *, warn: bool = False,
                strict: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """limayaml.Load: parse, check params, merge default/override and fill defaults.
    strict: also check the JSON schema right after parsing."""
    raw = parse_yaml(data, f"main file {bq(yaml_path)}")
    if strict:
        errs = schema_errors(raw)
        if errs:
            raise SchemaError("\n".join(errs))
    d = load_aux_config(ctx, "default.yaml", "default")
    o = load_aux_config(ctx, "override.yaml", "override")
    check_param_used(raw)
    try:
        cfg = fill_defaults(raw, d, o, os.path.dirname(yaml_path), ctx.log, warn)
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise LoadError(f"failed to unmarshal YAML (main file {bq(yaml_path)}): {e}")
    return raw, cfg

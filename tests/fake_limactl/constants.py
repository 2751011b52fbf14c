"""Lima's fixed values that the double follows: its version, name and path limits, the key
order of `limactl list --json`'s `config` (Go's limatype.LimaYAML) and the template fields."""

from __future__ import annotations

import os
import re
import sys

VERSION = "v2.2.0"
HERE = os.path.dirname(os.path.abspath(__file__))
LIMACTL_PY = os.path.join(HERE, "limactl.py")  # the entry point (`limactl __boot` runs it again)
# The double runs under `python -S` (no site.py: the test machine's .pth files cost ~35 ms a call, and a
# test makes hundreds of calls); the folders holding PyYAML and jsonschema come in this variable instead,
# which limactl.py takes out of the environment so that no guest or child of the caller sees it.
SYSPATH_VAR = "FAKE_LIMACTL_SYSPATH"
SYSPATH = os.environ.pop(SYSPATH_VAR, "")
sys.path.extend(p for p in SYSPATH.split(os.pathsep) if p and p not in sys.path)


def own_process(*args: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment to run the double again (`limactl __boot`, `__machine`)."""
    return [sys.executable, "-S", LIMACTL_PY, *args], dict(os.environ, **{SYSPATH_VAR: SYSPATH})
SCHEMA_PATH = os.path.join(os.path.dirname(HERE), "lima_schema.json")
STATE_FILE = "fake-state.json"
BOOT_SUBCOMMAND = "__boot"
MACHINE_SUBCOMMAND = "__machine"   # the running guest's agent (machine.py)
LISTENERS_SUBCOMMAND = "__listeners"  # the guest agent reporting listening sockets (hostagent.py)
ID_RE = re.compile(r"^[A-Za-z0-9]+(?:[._-](?:[A-Za-z0-9]+))*$")
USERNAME_RE = re.compile(r"^[a-z_][a-z0-9_-]*$")
PARAM_NAME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*$")
UNIX_PATH_MAX = 108 if sys.platform.startswith("linux") else 104
LONGEST_SOCK = "ssh.sock.1234567890123456"
TMP_SUFFIXES = (".pid", ".sock", ".tmp")
VM_TYPES = ("qemu", "vz", "wsl2", "krunkit")
ARCH_TYPES = ("x86_64", "aarch64", "armv7l", "ppc64le", "riscv64", "s390x")
OS_TYPES = ("Linux", "Darwin", "FreeBSD", "Windows")
SYSTEM_MOUNT_POINTS = ("/", "/bin", "/dev", "/etc", "/home", "/opt", "/sbin", "/tmp", "/usr", "/var")
PROXY_VARS = ("ftp_proxy", "http_proxy", "https_proxy", "no_proxy",
              "FTP_PROXY", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
SHELL_ENV_BLOCK = ["BASH*", "DISPLAY", "DYLD_*", "EUID", "FPATH", "GID", "GROUP", "HOME", "HOSTNAME",
                   "LD_*", "LOGNAME", "OLDPWD", "PATH", "PWD", "SHELL", "SHLVL", "SSH_*", "TERM",
                   "TERMINFO", "TMPDIR", "UID", "USER", "XAUTHORITY", "XDG_*", "ZDOTDIR", "ZSH*", "_*"]
# Key order of Go's limatype.LimaYAML (json output order of `config`).
CONFIG_ORDER = ["base", "minimumLimaVersion", "vmType", "vmOpts", "os", "arch", "images", "cpuType",
                "cpus", "memory", "disk", "additionalDisks", "mounts", "mountTypesUnsupported",
                "mountType", "mountInotify", "ssh", "firmware", "audio", "video", "provision",
                "upgradePackages", "containerd", "guestInstallPrefix", "probes", "portForwards",
                "copyToHost", "message", "networks", "env", "param", "dns", "hostResolver",
                "propagateProxyEnv", "caCerts", "rosetta", "plain", "timezone",
                "nestedVirtualization", "user", "tpm", "osOpts"]
PROVISION_ORDER = ["mode", "skipDefaultDependencyResolution", "script", "file", "playbook", "content",
                   "overwrite", "owner", "path", "permissions", "expression", "format"]
PORT_FORWARD_ORDER = ["guestIPMustBeZero", "guestIP", "guestPort", "guestPortRange", "guestSocket",
                      "hostIP", "hostPort", "hostPortRange", "hostSocket", "proto", "reverse",
                      "ignore", "static"]
TEMPLATE_FIELDS = ["Name", "Hostname", "Status", "Dir", "VMType", "Arch", "CPUs", "Memory", "Disk",
                   "Message", "AdditionalDisks", "Networks", "SSHLocalPort", "SSHConfigFile",
                   "HostAgentPID", "DriverPID", "Errors", "Config", "SSHAddress", "Protected",
                   "LimaVersion", "Param", "AutoStartedIdentifier"]

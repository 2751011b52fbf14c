#!/usr/bin/python3 -S
"""Programs inside the limactl double's guest, chosen by the name they are called by.

sudo                  the guest's passwordless sudo (guest root through the limactl process's bridge)
apt-get, apt          a package archive without a network: packages from PACKAGES "install" into the
                      dpkg status file, and each one's commands appear in /usr/local/bin as small stubs
                      unless the (host's, read-only) system already has them
dpkg-query            reads that status file
curl                  serves the few downloads agentbox's provisioning makes (a Node.js build from
                      nodejs.org and its SHASUMS256.txt, GitHub CLI's keyring); any other host cannot
                      be resolved, as in a guest without a network
systemctl             there is no systemd in the double: enable/start/restart succeed, status says inactive
update-ca-certificates  Debian's, for the guest's trust store (root's, in /usr/local/sbin like nft): the bundle
                      rebuilt from the system list and /usr/local/share/ca-certificates, without hash links or hooks

The stand-ins are first on PATH for `system` provisioning scripts only. Knobs the limactl double
passes in /run/fake-limactl/world.json: "offline" (every download fails), "aptListsLockedUntil" and
"dpkgLockedUntil" (epoch seconds: another apt, as unattended-upgrades on a first boot, holds the
apt-lists and the dpkg frontend lock).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import time

DPKG_STATUS = "/var/lib/dpkg/status"
UPDATED = "/var/lib/apt/lists/fake-limactl-updated"
WORLD = "/run/fake-limactl/world.json"
STUB_BIN = "/usr/local/bin"
NODE_DIST = "https://nodejs.org/dist/"
GH_KEYRING = "https://cli.github.com/packages/githubcli-archive-keyring.gpg"
LOCK_HOLDER = 1234
# package -> the commands it provides
PACKAGES = {
    "git": ["git"], "curl": ["curl"], "jq": ["jq"], "build-essential": ["make", "gcc", "g++"],
    "unzip": ["unzip"], "ca-certificates": [], "gnupg": ["gpg"], "tmux": ["tmux"], "docker.io": ["docker", "dockerd"],
    "docker-buildx": [], "docker-compose-v2": [], "gh": ["gh"], "sudo": ["sudo"],
    "nftables": ["nft"],  # root's nft is the stand-in below, in /usr/local/sbin
}


def world() -> dict:
    try:
        with open(WORLD, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def err(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


# -- sudo ------------------------------------------------------------------------------------

SUDO_KEEP = ("TERM", "COLORTERM", "DISPLAY", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES",
             "FAKE_LIMACTL_SUDO")
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/snap/bin"


def sudo(args: list[str]) -> int:
    preserve, login, keep = False, False, list(SUDO_KEEP)
    while args and args[0].startswith("-") and args[0] != "-":
        opt = args.pop(0)
        if opt == "--":
            break
        if opt in ("-n", "--non-interactive", "-H", "--set-home", "-S", "--stdin"):
            continue
        if opt in ("-E", "--preserve-env"):
            preserve = True
        elif opt.startswith("--preserve-env="):
            keep += opt.split("=", 1)[1].split(",")
        elif opt in ("-i", "--login"):
            login = True
        elif opt in ("-u", "--user") or opt.startswith("--user="):
            who = opt.split("=", 1)[1] if "=" in opt else (args.pop(0) if args else "")
            if who not in ("root", "#0", "0"):
                err(f"fake limactl sudo: only `-u root` is supported (got {who})")
                return 1
        elif opt in ("-v", "--validate"):
            return 0
        elif opt in ("-l", "--list"):
            print("User may run the following commands:\n    (ALL : ALL) NOPASSWD: ALL")
            return 0
        else:
            err(f"fake limactl sudo: option {opt} is not supported by the test double")
            return 1
    if not args and not login:
        err("usage: sudo [-nEi] [-u root] command [arg ...]")
        return 1
    caller = os.environ.get("USER", "")
    if preserve:
        env = dict(os.environ)
    else:
        env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("LC_")}
        env.update(PATH=SECURE_PATH)
    env.update(HOME="/root", USER="root", LOGNAME="root", SHELL="/bin/bash", MAIL="/var/mail/root",
               SUDO_USER=caller, SUDO_UID=str(os.getuid()), SUDO_GID=str(os.getgid()),
               SUDO_COMMAND=" ".join(args) or "/bin/bash")
    if login:
        argv = ["/bin/bash", "-l"] + (["-c", " ".join(_quote(a) for a in args)] if args else [])
    else:
        argv = args
    if os.geteuid() == 0:
        os.execvpe(argv[0], argv, env)
    path = os.environ.get("FAKE_LIMACTL_SUDO")
    if not path:
        err("fake limactl sudo: no way to reach guest root here (FAKE_LIMACTL_SUDO is not set)")
        return 1
    env.pop("FAKE_LIMACTL_SUDO", None)
    request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode("utf-8", "surrogateescape")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError as e:  # as sudo fails when it cannot reach root: one line, exit 1
            err(f"sudo: cannot reach guest root through {path}: {e.strerror}")
            return 1
        socket.send_fds(s, [request], [0, 1, 2])
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    answer = json.loads(reply or b'{"error": "no answer"}')
    if "error" in answer:
        err(f"sudo: {answer['error']}")
        return 1
    return int(answer["code"])


def _quote(s: str) -> str:
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\"'\"'") + "'"


# -- the package world -------------------------------------------------------------------------

def installed() -> list[str]:
    try:
        with open(DPKG_STATUS, encoding="utf-8") as f:
            return re.findall(r"^Package: (\S+)\nStatus: install ok installed$", f.read(), re.M)
    except OSError:
        return []


def record_installed(names: list[str]) -> None:
    os.makedirs(os.path.dirname(DPKG_STATUS), exist_ok=True)
    with open(DPKG_STATUS, "a", encoding="utf-8") as f:
        for name in names:
            f.write(f"Package: {name}\nStatus: install ok installed\nVersion: 0.0.0-fake\n\n")


def on_path(command: str) -> bool:
    for d in os.environ.get("PATH", "").split(":"):
        if d and not d.startswith("/.fake-limactl") and os.access(os.path.join(d, command), os.X_OK):
            return True
    return False


def lock_held(lock: str) -> bool:
    return float(world().get(lock) or 0) > time.time()


def apt_get(args: list[str]) -> int:
    options: dict[str, str] = {}
    words: list[str] = []
    it = iter(args)
    for a in it:
        if a == "-o":
            key, _, value = next(it, "").partition("=")
            options[key.lower()] = value
        elif a.startswith("-o"):
            key, _, value = a[2:].partition("=")
            options[key.lower()] = value
        elif a.startswith("-"):
            continue
        else:
            words.append(a)
    if not words:
        err("E: Invalid operation")
        return 100
    if os.geteuid() != 0:
        err("E: Could not open lock file /var/lib/dpkg/lock-frontend - open (13: Permission denied)")
        err("E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), are you root?")
        return 100
    command, names = words[0], words[1:]
    if command == "update":
        if lock_held("aptListsLockedUntil"):  # apt-get update does not wait for the lists lock, whatever DPkg::Lock::Timeout says
            err(f"E: Could not get lock /var/lib/apt/lists/lock. It is held by process {LOCK_HOLDER} (apt-get)")
            err("E: Unable to lock directory /var/lib/apt/lists/")
            return 100
        if world().get("offline"):
            err("W: Failed to fetch http://archive.ubuntu.com/ubuntu/dists/noble/InRelease  "
                "Temporary failure resolving 'archive.ubuntu.com'")
            err("E: Some index files failed to download. They have been ignored, or old ones used instead.")
            return 100
        os.makedirs(os.path.dirname(UPDATED), exist_ok=True)
        open(UPDATED, "w").close()
        print("Reading package lists...")
        return 0
    if command != "install":
        err(f"fake limactl apt-get: `{command}` is not supported by the test double")
        return 100
    timeout = int(options.get("dpkg::lock::timeout") or 0)
    deadline = time.time() + timeout
    while lock_held("dpkgLockedUntil"):
        if time.time() >= deadline:
            err(f"E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process {LOCK_HOLDER} "
                "(unattended-upgr)")
            err("E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), "
                "is another process using it?")
            return 100
        print(f"Waiting for cache lock: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process "
              f"{LOCK_HOLDER} (unattended-upgr)", flush=True)
        time.sleep(min(1.0, max(0.0, deadline - time.time())))
    if not os.path.exists(UPDATED):
        err(f"E: Unable to locate package {names[0] if names else ''}")
        return 100
    unknown = [n for n in names if n not in PACKAGES]
    if unknown:
        err(f"E: Unable to locate package {unknown[0]}")
        return 100
    new = [n for n in names if n not in installed()]
    for name in new:
        for command_name in PACKAGES[name]:
            if not on_path(command_name):
                _write_stub(command_name, name)
    record_installed(new)
    print(f"{len(new)} newly installed")
    return 0


def _write_stub(command: str, package: str) -> None:
    path = os.path.join(STUB_BIN, command)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"#!/bin/sh\n# fake limactl: `{command}` from the stand-in package {package}\n"
                f'case "$1" in --version|version) echo "{command} version 0.0.0-fake"; exit 0 ;; esac\n'
                f'echo "{command}: the limactl double\'s stand-in for {package} does nothing" >&2\nexit 1\n')
    os.chmod(path, 0o755)


def dpkg_query(args: list[str]) -> int:
    fmt = "${Package}\t${Status}\n"
    names = []
    it = iter(args)
    for a in it:
        if a in ("-f", "--showformat"):
            fmt = next(it, fmt)
        elif a.startswith(("--showformat=", "-f=")):
            fmt = a.split("=", 1)[1]
        elif a.startswith("-f") and len(a) > 2:
            fmt = a[2:]
        elif a in ("-W", "--show"):
            continue
        else:
            names.append(a)
    have = installed()
    code = 0
    for name in names:
        if name in have:
            sys.stdout.write(fmt.replace("${Package}", name).replace("${Status}", "install ok installed")
                             .replace("${Version}", "0.0.0-fake").replace("\\n", "\n"))
        else:
            err(f"dpkg-query: no packages found matching {name}")
            code = 1
    return code


# -- downloads ---------------------------------------------------------------------------------

def node_tarball(version: str, arch: str) -> bytes:
    """A small stand-in for nodejs.org's node-VERSION-linux-ARCH.tar.xz: the same layout (bin, lib,
    include, share and the README/LICENSE/CHANGELOG beside them), with node and npm as scripts."""
    top = f"node-{version}-linux-{arch}"
    node = f'#!/bin/sh\ncase "$1" in -v|--version) echo "{version}"; exit 0 ;; esac\n' \
           'echo "node: the limactl double\'s stand-in runs no JavaScript" >&2\nexit 1\n'
    files = {
        f"{top}/bin/node": (node, 0o755),
        f"{top}/bin/npm": (NPM_SCRIPT, 0o755),
        f"{top}/lib/node_modules/npm/package.json": ('{"name": "npm", "version": "10.9.4"}\n', 0o644),
        f"{top}/include/node/node.h": ("/* stand-in */\n", 0o644),
        f"{top}/share/doc/node/gdbinit": ("# stand-in\n", 0o644),
        f"{top}/README.md": ("# Node.js (stand-in)\n", 0o644),
        f"{top}/LICENSE": ("stand-in\n", 0o644),
        f"{top}/CHANGELOG.md": ("stand-in\n", 0o644),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:xz", preset=0) as tar:
        for name, (text, mode) in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, 1700000000, 1001, 1001
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


NPM_SCRIPT = r'''#!/bin/sh
# npm stand-in: `config get/set prefix` (in ~/.npmrc) and `install -g` of the agents (as stubs)
prefix() { sed -n 's/^prefix=//p' "$HOME/.npmrc" 2>/dev/null | tail -n 1; }
case "$1" in
  --version|-v) echo 10.9.4 ;;
  config)
    case "$2 $3" in
      "get prefix") p="$(prefix)"; echo "${p:-/usr/local}" ;;
      "set prefix") grep -v '^prefix=' "$HOME/.npmrc" > "$HOME/.npmrc.new" 2>/dev/null; echo "prefix=$4" >> "$HOME/.npmrc.new"; mv "$HOME/.npmrc.new" "$HOME/.npmrc" ;;
      *) echo "npm stand-in: unsupported: npm $*" >&2; exit 1 ;;
    esac ;;
  install|i)
    shift; p="$(prefix)"; p="${p:-/usr/local}"
    for pkg in "$@"; do
      case "$pkg" in
        -g|--global) continue ;;
        @anthropic-ai/claude-code*) bin=claude ;;
        @openai/codex*) bin=codex ;;
        @google/gemini-cli*) bin=gemini ;;
        *) # npm 10's way: the error, then where its debug log is (written under ~/.npm/_logs)
          logs="$HOME/.npm/_logs"; log="$logs/$(date -u +%Y-%m-%dT%H_%M_%S_%3NZ)-debug-0.log"
          mkdir -p "$logs" && echo "0 verbose cli npm stand-in; 404 Not Found - GET $pkg" > "$log"
          { echo "npm error code E404"
            echo "npm error 404 Not Found - GET https://registry.npmjs.org/$pkg - Not found"
            echo "npm error 404"
            echo "npm error 404  '$pkg@*' is not in this registry."
            echo "npm error 404"
            echo "npm error 404 Note that you can also install from a"
            echo "npm error 404 tarball, folder, http url, or git url."
            echo "npm error A complete log of this run can be found in: $log"; } >&2
          exit 1 ;;
      esac
      mkdir -p "$p/bin" || exit 1
      printf '#!/bin/sh\necho "%s (stand-in) $*"\n' "$bin" > "$p/bin/$bin" && chmod 755 "$p/bin/$bin" || exit 1
    done ;;
  *) echo "npm stand-in: unsupported: npm $*" >&2; exit 1 ;;
esac
'''


def curl(args: list[str]) -> int:
    output, url, remote_name = None, None, False
    it = iter(args)
    for a in it:
        if a == "--remote-name" or re.fullmatch(r"-[a-zA-Z]*O[a-zA-Z]*", a):
            remote_name = True
        if a in ("-o", "--output"):
            output = next(it, None)
        elif a.startswith("--output="):
            output = a.split("=", 1)[1]
        elif re.fullmatch(r"-[a-zA-Z]*o", a):
            output = next(it, None)
        elif a in ("--retry", "--max-time", "-m", "--connect-timeout", "-H", "--header", "-w"):
            next(it, None)
        elif a.startswith("-"):
            continue
        else:
            url = a
    if url is None:
        err("curl: no URL specified!")
        return 2
    if remote_name and output is None:
        output = url.rstrip("/").rsplit("/", 1)[-1]
    host = re.sub(r"^[a-z]+://", "", url).split("/")[0]
    body = None if world().get("offline") else _download(url)
    if body is None:
        err(f"curl: (6) Could not resolve host: {host}")
        return 6
    if output:
        with open(output, "wb") as f:
            f.write(body)
    else:
        sys.stdout.buffer.write(body)
    return 0


def _download(url: str) -> bytes | None:
    if url == GH_KEYRING:
        return b"stand-in keyring\n"
    m = re.fullmatch(re.escape(NODE_DIST) + r"(v[0-9.]+)/(.*)", url)
    if not m:
        return None
    version, name = m.groups()
    tarballs = {f"node-{version}-linux-{arch}.tar.xz": node_tarball(version, arch) for arch in ("x64", "arm64")}
    if name in tarballs:
        return tarballs[name]
    if name == "SHASUMS256.txt":
        return "".join(f"{hashlib.sha256(data).hexdigest()}  {n}\n" for n, data in sorted(tarballs.items())).encode()
    return None


def systemctl(args: list[str]) -> int:
    words = [a for a in args if not a.startswith("-")]
    if words and words[0] in ("enable", "disable", "start", "stop", "restart", "daemon-reload", "mask"):
        return 0
    if words and words[0] == "is-active":
        print("inactive")
        return 3
    print("System has not been booted with systemd as init system (PID 1). (limactl double)")
    return 1


# -- nft ---------------------------------------------------------------------------------------
#
# The double's guest shares the host's network namespace (and, on CI, guest root can act on it), so a
# real `nft -f` would change the test machine's firewall. This stand-in plays nft on the guest's
# ruleset kept in NFT_STATE (in nft's own listing form) and, when the host has nft, lets the real
# one do the work in a throwaway network namespace: the previous ruleset loaded, then the file, then
# listed. So a broken file fails as it would in a VM, with nft's own message.

NFT_STATE = "/run/fake-limactl/nft.ruleset"
NFT_REAL = ("/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft")
NFT_LAB = r"""set -e
nft=$0 state=$1
[ ! -s "$state" ] || "$nft" -f "$state"
case $2 in
  load) "$nft" -f "$3"; "$nft" list ruleset ;;
  table) "$nft" list table "$3" "$4" ;;
esac"""


def nft(args: list[str]) -> int:
    check, path, words = False, None, []
    it = iter(args)
    for a in it:
        if a in ("-c", "--check"):
            check = True
        elif a in ("-f", "--file"):
            path = next(it, None)
            if path is None:
                err("nft: option requires an argument -- 'f'")
                return 1
        elif a.startswith("--file="):
            path = a.split("=", 1)[1]
        elif a.startswith("-"):
            err(f"fake limactl nft: option {a} is not supported by the test double")
            return 1
        else:
            words.append(a)
    if path is None and not (words == ["list", "ruleset"] or (words[:2] == ["list", "table"] and len(words) == 4)):
        err(f"fake limactl nft: `nft {' '.join(args)}` is not supported by the test double "
            "(it takes -f FILE, -c -f FILE, list ruleset, list table FAMILY NAME)")
        return 1
    if os.geteuid() != 0:
        if path is None:
            err("Operation not permitted (you must be root)")
        err("netlink: Error: cache initialization failed: Operation not permitted")
        return 1
    if path is not None:
        return _nft_load(path, check)
    if words == ["list", "ruleset"]:
        sys.stdout.write(_nft_state())
        return 0
    real = _nft_lab()
    if real is None:  # no nft on the host: only the state's own text can answer
        state = _nft_state()
        if f"table {words[2]} {words[3]}" in state:
            sys.stdout.write(state)
            return 0
        err(f"Error: No such file or directory\nlist table {words[2]} {words[3]}")
        return 1
    done = subprocess.run(real + [NFT_STATE, "table", words[2], words[3]],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


def _nft_state() -> str:
    try:
        with open(NFT_STATE, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _nft_lab() -> list[str] | None:
    """argv prefix that runs NFT_LAB with the real nft in a throwaway network namespace, or None."""
    real = next((p for p in NFT_REAL if os.access(p, os.X_OK)), None)
    if real is None:
        return None
    for namespace in (["unshare", "--net"], ["unshare", "--map-root-user", "--net"]):
        if subprocess.run(namespace + ["true"], capture_output=True).returncode == 0:
            return namespace + ["sh", "-c", NFT_LAB, real]
    return None


def _nft_load(path: str, check: bool) -> int:
    if path == "-" or path == "/dev/stdin":
        text = sys.stdin.read()
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            err(f"Error: Could not process rule: {e.strerror}\n{path}")
            return 1
    real = _nft_lab()
    if real is None:
        listing = text  # unchecked: the host has no nft to read it
    else:
        import tempfile

        os.makedirs(os.path.dirname(NFT_STATE), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".nft", dir="/run/fake-limactl", delete=False) as f:
            f.write(text)
        try:
            shown = path if path not in ("-", "/dev/stdin") else "/dev/stdin"
            done = subprocess.run(real + [NFT_STATE, "load", f.name],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True)
        finally:
            os.unlink(f.name)
        if done.returncode != 0:
            sys.stderr.write(done.stderr.replace(f.name, shown))
            return done.returncode
        listing = done.stdout
    if not check:
        os.makedirs(os.path.dirname(NFT_STATE), exist_ok=True)
        with open(NFT_STATE + ".tmp", "w", encoding="utf-8") as f:
            f.write(listing)
        os.replace(NFT_STATE + ".tmp", NFT_STATE)
    return 0


# -- update-ca-certificates ----------------------------------------------------------------------
# Debian's /usr/sbin/update-ca-certificates (ca-certificates 20230311), as far as the guest's trust store goes: the
# bundle rebuilt from the certificates /etc/ca-certificates.conf lists (under /usr/share/ca-certificates) and every
# *.crt under /usr/local/share/ca-certificates, a NAME.pem link in /etc/ssl/certs for each, --fresh clearing those
# links first. Not done: `openssl rehash` (hash links) and the hooks in /etc/ca-certificates/update.d.

CA_CONF = "/etc/ca-certificates.conf"
CA_SYSTEM_DIR = "/usr/share/ca-certificates"
CA_LOCAL_DIR = "/usr/local/share/ca-certificates"
CA_ETC_DIR = "/etc/ssl/certs"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def update_ca_certificates(args: list[str]) -> int:
    fresh = False
    for a in args:
        if a in ("--fresh", "-f"):
            fresh = True
        elif a not in ("--verbose", "-v"):
            err(f"fake limactl update-ca-certificates: option {a} is not supported by the test double")
            return 1
    if os.geteuid() != 0 or not os.access(CA_ETC_DIR, os.W_OK):
        err(f"ln: failed to create symbolic link '{CA_BUNDLE}.new': Permission denied")
        return 1
    certs = []
    try:
        with open(CA_CONF, encoding="utf-8") as f:
            listed = [line.strip() for line in f if line.strip() and line[0] not in "#!"]
    except OSError:
        listed = []
    if not listed:
        fresh = True  # as Debian's: an empty or missing configuration means --fresh
    for name in listed:
        path = os.path.join(CA_SYSTEM_DIR, name)
        if os.path.isfile(path):
            certs.append(path)
        else:
            err(f"W: {path} not found, but listed in {CA_CONF}.")
    if os.path.isdir(CA_LOCAL_DIR):
        local = []
        for folder, _, files in os.walk(CA_LOCAL_DIR, followlinks=True):
            local += [os.path.join(folder, f) for f in files if f.endswith(".crt") and os.path.isfile(os.path.join(folder, f))]
        certs += sorted(local)
    links = [os.path.join(CA_ETC_DIR, n) for n in os.listdir(CA_ETC_DIR)]
    if fresh:
        print(f"Clearing symlinks in {CA_ETC_DIR}...")
        for link in links:
            if os.path.islink(link) and os.readlink(link).startswith((CA_SYSTEM_DIR, CA_LOCAL_DIR)):
                os.unlink(link)
        print("done.")
    print(f"Updating certificates in {CA_ETC_DIR}...")
    added = 0
    bundle = []
    for cert in certs:
        pem = os.path.join(CA_ETC_DIR, os.path.basename(cert)[:-len(".crt")].replace(" ", "_") + ".pem")
        if not os.path.lexists(pem) or not os.path.exists(pem) or os.readlink(pem) != cert:
            if os.path.lexists(pem):
                os.unlink(pem)
            os.symlink(cert, pem)
            added += 1
        with open(cert, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
        bundle.append(text if text.endswith("\n") else text + "\n")
    if added:
        for link in (os.path.join(CA_ETC_DIR, n) for n in os.listdir(CA_ETC_DIR)):
            if os.path.islink(link) and not os.path.exists(link):
                os.unlink(link)  # Debian removes orphan links before `openssl rehash`
    with open(CA_BUNDLE + ".new", "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write("".join(bundle))
    os.chmod(CA_BUNDLE + ".new", 0o644)
    os.replace(CA_BUNDLE + ".new", CA_BUNDLE)
    print(f"{added} added, 0 removed; done.")
    return 0


PROGRAMS = {"sudo": sudo, "nft": nft, "update-ca-certificates": update_ca_certificates, "apt-get": apt_get, "apt": apt_get, "dpkg-query": dpkg_query, "curl": curl,
            "systemctl": systemctl}


def main() -> int:
    name = os.path.basename(sys.argv[0])
    program = PROGRAMS.get(name)
    if program is None:
        err(f"fake limactl guest tools: unknown program {name}")
        return 127
    try:
        return program(sys.argv[1:])
    except BrokenPipeError:
        return 141


if __name__ == "__main__":
    sys.exit(main())

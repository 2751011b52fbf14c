# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# The credential broker's CA (agentbox.net.certauthority; staged by agentbox.session.staging as broker/): in the guest's trust
# store while the host brokers this VM's credentials, with the variables Node, Python and OpenSSL read pointed at
# that store; removed when the host no longer brokers them.
# Reads launch.sh's staging, state.

broker_ca_file=/usr/local/share/ca-certificates/agentbox-broker.crt  # contract.GUEST_BROKER_CA
broker_ca_bundle=/etc/ssl/certs/ca-certificates.crt  # contract.GUEST_CA_BUNDLE: Debian's, which git's curl reads too
broker_ca_failed=122  # contract.BROKER_CA_FAILED

apply_broker_ca() {
  # The warm path (the same CA as last time, still in place) runs no program: bash's read and test only.
  # The stamp says where it is trusted: "system DIGEST" (the trust store, with sudo) or "user DIGEST" (a VM
  # without passwordless sudo: a bundle of the store's roots and the CA in the state folder, named by the
  # variables, which every client the agent starts reads).
  local stamp="$state/broker-ca.sha256" staged_digest="" installed="" where="" bundle="$broker_ca_bundle"
  [ ! -r "$stamp" ] || read -r where installed < "$stamp" || true
  if [ ! -r "$staging/broker/ca.crt" ]; then
    if [ "$where" = user ]; then
      rm -f "$state/broker-ca-bundle.crt" "$stamp"
    elif [ -n "$installed" ] || [ -e "$broker_ca_file" ]; then
      remove_broker_ca "$stamp"
    fi
    return 0
  fi
  read -r staged_digest < "$staging/broker/ca.sha256" || true
  if [ "$where" = user ] && [ "$staged_digest" = "$installed" ] && [ -r "$state/broker-ca-bundle.crt" ]; then
    bundle="$state/broker-ca-bundle.crt"
  elif [ "$where" != system ] || [ -z "$staged_digest" ] || [ "$staged_digest" != "$installed" ] \
      || [ ! -e "$broker_ca_file" ]; then
    if sudo -n true 2>/dev/null; then
      install_broker_ca "$stamp" "$staged_digest"
    else
      bundle="$state/broker-ca-bundle.crt"
      user_broker_ca "$stamp" "$staged_digest" "$bundle"
    fi
  fi
  # Node adds these to its own roots; Python's requests and httpx would use certifi's; OpenSSL-based tools
  # read the same bundle by default. Codex (Rust, rustls with the system store) reads SSL_CERT_FILE or the store.
  export NODE_EXTRA_CA_CERTS="$bundle" SSL_CERT_FILE="$bundle" REQUESTS_CA_BUNDLE="$bundle"
  [ "$bundle" = "$broker_ca_bundle" ] || export GIT_SSL_CAINFO="$bundle" CURL_CA_BUNDLE="$bundle"
}

user_broker_ca() {
  local stamp="$1" digest="$2" bundle="$3" roots=""
  [ ! -r "$broker_ca_bundle" ] || roots="$(<"$broker_ca_bundle")"
  # bash alone (a guest this bare may lack more than sudo); the stamp is written last, so a bundle cut short is
  # made again at the next launch
  printf '%s\n%s\n' "$roots" "$(<"$staging/broker/ca.crt")" > "$bundle"
  printf 'user %s\n' "$digest" > "$stamp"
  say "no passwordless sudo in the VM: the credential broker's CA is trusted through SSL_CERT_FILE," \
      "NODE_EXTRA_CA_CERTS, REQUESTS_CA_BUNDLE and GIT_SSL_CAINFO ($bundle), not the system trust store"
}

install_broker_ca() {
  local stamp="$1" digest="$2" output certificate bundle
  # Root writes the file from this shell's stdin (the redirect is the user's on purpose): it never reads the
  # staging mount itself.
  # shellcheck disable=SC2016,SC2024 # expanded by root's sh
  if ! output="$(sudo -n /bin/sh -c '
      command -v update-ca-certificates >/dev/null 2>&1 ||
        { echo "update-ca-certificates is not installed (the ca-certificates package)"; exit 1; }
      umask 022 && mkdir -p "${1%/*}" && cat > "$1.agentbox-new" && mv -f "$1.agentbox-new" "$1" && update-ca-certificates' \
      sh "$broker_ca_file" < "$staging/broker/ca.crt" 2>&1)"; then
    broker_ca_failure "${output:-sudo or update-ca-certificates failed and said nothing}"
  fi
  certificate="$(<"$staging/broker/ca.crt")"
  bundle="$(<"$broker_ca_bundle")" || bundle=""
  if [[ "$bundle" != *"$certificate"* ]]; then
    broker_ca_failure "update-ca-certificates ran, but $broker_ca_bundle does not hold the certificate"
  fi
  printf 'system %s\n' "$digest" > "$stamp"
}

remove_broker_ca() {
  local stamp="$1" output
  # shellcheck disable=SC2016 # expanded by root's sh
  if output="$(sudo -n /bin/sh -c 'rm -f "$1" && update-ca-certificates --fresh' sh "$broker_ca_file" 2>&1)"; then
    rm -f "$stamp"
  else
    say "could not remove the credential broker's CA from the VM's trust store ($broker_ca_file): ${output##*$'\n'}"
    retry_next_launch
  fi
}

broker_ca_failure() {
  local reason="${1//$'\n'/ }"
  [ "${#reason}" -le 600 ] || reason="...${reason: -600}"
  say "the credential broker's CA could not be installed in the VM's trust store ($broker_ca_file): ${reason}"
  say "the agents' requests to their credential hosts would fail TLS checks, so the launch stops."
  say "fix it in the VM without agentbox's launch (\`limactl shell ${HOSTNAME#lima-} sudo apt-get install -y ca-certificates\`"
  say "where it is missing), or make the VM anew: \`agentbox start --recreate\`."
  exit "$broker_ca_failed"
}

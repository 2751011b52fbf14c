# shellcheck shell=bash disable=SC2154 # launch.sh sets what this part reads (tests/test_launch_parts.py checks the names)
# agentbox-managed: a part of launch.sh, which sources it from the staging folder's launch/.
# Canary secrets (agentbox.session.canaries): this session's, made on the host, placed where agents look for secrets.
# The proxy refuses any request that carries one. A file the user keeps there (not the one this script last wrote)
# is left alone. Builtins only: no process on a launch that has nothing else to do.
# Reads launch.sh's staging, state, canaries.

place_canaries() {
  [ -n "$canaries" ] || return 0
  local staged="$staging/canaries/$canaries" line key value aws_id="" aws_secret="" env_name="" env_value="" dotenv=""
  [ -r "$staged" ] || return 0
  while IFS= read -r line; do
    key="${line%%=*}" value="${line#*=}"
    case "$key" in
      aws_id) aws_id="$value" ;;
      aws_secret) aws_secret="$value" ;;
      env_name) env_name="$value" ;;
      env) env_value="$value" ;;
      dotenv) dotenv="$value" ;;
    esac
  done < "$staged"
  [ -d "$HOME/.aws" ] || mkdir -m 700 "$HOME/.aws"
  [ -d "$state" ] || mkdir -p "$state"
  local content
  printf -v content '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$aws_id" "$aws_secret"
  place_canary_file "$HOME/.aws/credentials" aws "$content"
  printf -v content 'DATABASE_URL=postgres://app:%s@db.internal:5432/app\n' "$dotenv"
  place_canary_file "$HOME/.env" dotenv "$content"
  # the config's env wins: a name it sets is the user's
  if [ -n "$env_name" ] && [ -z "${!env_name+x}" ]; then
    export "$env_name=$env_value"
  fi
}

# place_canary_file FILE KIND CONTENT: FILE is written (0600) when it is absent or holds what this script last wrote.
place_canary_file() {
  local file="$1" record="$state/canary.$2" content="$3" current="" last=""
  if [ -e "$file" ]; then
    IFS= read -r -d '' current < "$file" || true
    [ -r "$record" ] && { IFS= read -r -d '' last < "$record" || true; }
    [ -n "$last" ] && [ "$current" = "$last" ] || return 0
  else
    install -m 600 /dev/null "$file"  # once: a rewrite keeps the mode
  fi
  [ -e "$record" ] || install -m 600 /dev/null "$record"
  printf '%s' "$content" > "$file"
  printf '%s' "$content" > "$record"
}

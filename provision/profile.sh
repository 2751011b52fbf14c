# shellcheck shell=sh
# agentbox-managed: PATH for agents installed per user (sourced by login shells)
# Debian's and Ubuntu's ~/.profile add ~/.local/bin themselves, after this file: adding it here too
# would put it on PATH twice. Only a home whose profile does not is given it here.
case ":$PATH:" in
  *":$HOME/.local/bin:"*) ;;
  *)
    if ! grep -qs '\.local/bin' "$HOME/.profile" "$HOME/.bash_profile" "$HOME/.bash_login"; then
      export PATH="$HOME/.local/bin:$PATH"
    fi
    ;;
esac

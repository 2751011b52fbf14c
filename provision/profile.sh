# shellcheck shell=sh
# agentbox-managed: PATH for agents installed per user (sourced by login shells)
case ":$PATH:" in
  *":$HOME/.local/bin:"*) ;;
  *) export PATH="$HOME/.local/bin:$PATH" ;;
esac

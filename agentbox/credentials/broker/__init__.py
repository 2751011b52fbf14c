"""The credential broker: each service it speaks for, what a VM gets instead of a login, its proxy process."""

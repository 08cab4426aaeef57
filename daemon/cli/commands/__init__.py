"""The commands of `adapterd`, a module a group of them; daemon/cli/app.py registers each on the app."""

"""The command line, one module per command (or command group): each turns its flags into a
checked, typed plan (shared flag groups: harness.commands.options) and makes one call into the
library below; nothing under harness/ but this package and the root `cli` imports click."""

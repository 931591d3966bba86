"""The low-level tools every other package uses, one of each: errors by cause, files (safe loading, atomic writes,
the partial-file names), grammars for every value that reaches a rendered file, the safe join, validation,
progress, streaming, the fetcher, the disk helper, run identity and failpoints, host facts, SSH and the Ansible
runner, Jinja rendering.

May import: nothing of ``imagebuilder`` outside ``core``.
"""

"""Providers: one package each, owning its whole life: ``provider`` (its config model, plan steps, Packer context
and secrets, packaging) and the tasks before or after its build (``ami.export``, ``nutanix.image_upload``,
``cloudstack.template_register``).

``registry`` maps names to them; ``config`` holds what every config model shares; ``base`` what every provider
shares. Shared code imports ``registry`` and asks the provider; it never branches on a provider's name. The build
plan a provider contributes steps to is only named in annotations here: the build sits above the providers.

May import: ``core``, ``release``, ``attest``, ``publish``, ``customization``, ``image``, ``hardening``, ``vsphere``,
``plan``.
"""

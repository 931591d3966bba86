"""Providers: one module each (its config model, plan steps, Packer context and secrets, packaging).

``registry`` maps names to them; ``config`` holds what every config model shares; ``base`` what every provider
shares. Shared code imports ``registry`` and asks the provider; it never branches on a provider's name.
"""

"""What a build is asked and what it will do: the request as the user gave it, the plan made of it
(:mod:`.model`), and the base of every provider's config file (:mod:`.config`). One layer below ``providers``, so
a provider takes a plan as a plain import, and above what a plan is made of.

May import: ``core``, ``release``, ``attest``, ``publish``, ``customization``, ``image``, ``hardening``, ``vsphere``.
"""

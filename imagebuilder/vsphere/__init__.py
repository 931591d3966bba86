"""vSphere preparation (spec 2.4-2.7, 3, 4.6, 4.7): what a user otherwise types as govc commands.

Layers, lowest first:

- :mod:`.session`   -- where the server is, the credentials (environment only), TLS (verify, pin, or insecure),
  the logged-in SOAP session (pyvmomi) with an API call counter;
- :mod:`.rest`      -- the vSphere Automation REST session (``/api`` where the server has it, ``/rest`` otherwise);
- :mod:`.sso`       -- the SSO admin SOAP API (users, groups), which pyvmomi does not cover;
- :mod:`.inventory` -- inventory paths, folders;
- :mod:`.tags`, :mod:`.library` -- tagging and content library over REST;
- :mod:`.userconfig`, :mod:`.access` -- ``user.yaml`` and ``vsphere.setup-user``;
- :mod:`.templates` -- ``template.import``, ``template.tag``, ``template.validate``;
- :mod:`.clusterspec` -- ``cluster.validate``;
- :mod:`.apply_customization` -- ``template.customize``: the customization applied to a template's clone.

May import: ``core``, ``release``, ``attest``, ``publish``, ``customization``, ``image``, ``hardening``.
"""

"""CloudStack (orchestrator): the OS-3 qcow2 build (``provider``) and the template made of it after the build
(``template_register``, spec 1.7)."""

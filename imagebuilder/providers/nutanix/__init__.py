"""Nutanix (hci): the build on Prism (``provider``) and the source image it starts from, created in Prism Central
before the build (``image_upload``, spec 4.3)."""

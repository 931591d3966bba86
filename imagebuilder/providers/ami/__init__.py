"""AWS: the AMI build (``provider``: its config, plan steps, Packer context and packaging) and the export of a built
AMI to a raw disk in S3 (``export``, spec 4.4)."""

#!/usr/bin/python
"""Register with an activation key over subscription-manager's D-Bus API (com.redhat.RHSM1).

Why a module and not ``subscription-manager register --activationkey=KEY``: a command line is readable by every
process of the machine for as long as the command runs (/proc/PID/cmdline). A module receives its arguments in
the file Ansible ships it, and this one hands the key to rhsmd over D-Bus: the key is in no process's argv.

The API, as subscription-manager documents it: ``RegisterServer.Start(locale)`` on the system bus returns the
address of a private bus; on it, ``Register.RegisterWithActivationKeys(org, keys, options, connection_options,
locale)``; then ``RegisterServer.Stop(locale)``. The Satellite, when there is one, is already in rhsm.conf (its
katello-ca-consumer package put it there), so the connection options stay empty.
"""

DOCUMENTATION = r"""
module: rhsm_register_key
short_description: Register a RHEL system with an activation key over RHSM's D-Bus API
description: The key reaches rhsmd over D-Bus, never a command line.
options:
  org_id:
    description: The organization the activation key belongs to.
    type: str
    required: true
  activation_key:
    description: The activation key (a secret).
    type: str
    required: true
    no_log: true
  timeout:
    description: Seconds to wait for the registration.
    type: int
    default: 600
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - after DOCUMENTATION, as modules are laid out

BUS_NAME = "com.redhat.RHSM1"


def register(org_id: str, key: str, timeout: int) -> None:
    import dbus
    import dbus.connection

    bus = dbus.SystemBus()
    server = bus.get_object(BUS_NAME, "/com/redhat/RHSM1/RegisterServer")
    address = server.Start("", dbus_interface="com.redhat.RHSM1.RegisterServer", timeout=timeout)
    try:
        private = dbus.connection.Connection(address)
        registrar = private.get_object(BUS_NAME, "/com/redhat/RHSM1/Register", introspect=False)
        options = dbus.Dictionary({}, signature="sv")
        registrar.RegisterWithActivationKeys(
            org_id,
            dbus.Array([key], signature="s"),
            options,
            dbus.Dictionary({}, signature="sv"),
            "",
            dbus_interface="com.redhat.RHSM1.Register",
            timeout=timeout,
        )
        private.close()
    finally:
        server.Stop("", dbus_interface="com.redhat.RHSM1.RegisterServer", timeout=timeout)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "org_id": {"type": "str", "required": True},
            "activation_key": {"type": "str", "required": True, "no_log": True},
            "timeout": {"type": "int", "default": 600},
        },
        supports_check_mode=False,
    )
    try:
        import dbus
    except ImportError:
        module.fail_json(msg="python3-dbus is missing (subscription-manager's own dependency)")
    try:
        register(module.params["org_id"], module.params["activation_key"], module.params["timeout"])
    except dbus.exceptions.DBusException as exc:
        # rhsmd's message (wrong key, unknown org, Satellite unreachable); it never repeats the key
        module.fail_json(msg=f"registration refused: {exc.get_dbus_message()}")
    module.exit_json(changed=True)


if __name__ == "__main__":
    main()

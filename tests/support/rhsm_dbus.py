"""A stand-in for rhsmd's D-Bus registration API (com.redhat.RHSM1), run by the system Python (python3-dbus).

Contract, as subscription-manager documents it: on the bus, ``/com/redhat/RHSM1/RegisterServer`` with
``Start(s locale) -> s address`` of a private bus and ``Stop(s locale) -> b``; on that private bus,
``/com/redhat/RHSM1/Register`` with ``RegisterWithActivationKeys(s org, as keys, a{sv} options,
a{sv} connection_options, s locale) -> s`` (the consumer as JSON). Signatures are enforced by D-Bus itself.

What a call does here: it records what it was given in a JSON file, and which processes of this machine hold the
key in their command line at that moment (the point of registering over D-Bus is that none does); a key other
than the expected one is refused as rhsmd refuses it.

Usage: RHSM_EXPECTED_KEY=... /usr/bin/python3 rhsm_dbus.py BUS_ADDRESS RECORD_FILE (the key in the environment:
in this process's own command line it would be found by the very check it makes)
"""

import json
import os
import sys

import dbus
import dbus.mainloop.glib
import dbus.server
import dbus.service
from gi.repository import GLib

BUS_ADDRESS, RECORD = sys.argv[1:3]
EXPECTED = os.environ["RHSM_EXPECTED_KEY"]
NAME = "com.redhat.RHSM1"


def holders_of(secret):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if secret.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def record(**fields):
    data = {}
    if os.path.exists(RECORD):
        with open(RECORD) as fh:
            data = json.load(fh)
    data.update(fields)
    with open(RECORD, "w") as fh:
        json.dump(data, fh)


class Register(dbus.service.Object):
    @dbus.service.method(f"{NAME}.Register", in_signature="sasa{sv}a{sv}s", out_signature="s")
    def RegisterWithActivationKeys(self, org, keys, options, connection_options, locale):
        keys = [str(k) for k in keys]
        record(
            org=str(org),
            keys=keys,
            options=dict(options),
            connection_options=dict(connection_options),
            argv_holders=[p for k in keys for p in holders_of(k)],
        )
        if keys != [EXPECTED]:
            raise dbus.exceptions.DBusException(
                "None of the activation keys specified exist for this org.", name=f"{NAME}.Error"
            )
        return json.dumps({"uuid": "6b1a4c1e-0000-4000-8000-00000000c0de", "name": "node"})


class Private(dbus.server.Server):
    def connection_added(self, conn):
        Register(conn, "/com/redhat/RHSM1/Register")


class RegisterServer(dbus.service.Object):
    server = None

    @dbus.service.method(f"{NAME}.RegisterServer", in_signature="s", out_signature="s")
    def Start(self, locale):
        self.server = Private("unix:tmpdir=/tmp")
        record(started=True)
        return self.server.address

    @dbus.service.method(f"{NAME}.RegisterServer", in_signature="s", out_signature="b")
    def Stop(self, locale):
        if self.server is not None:
            self.server.disconnect()
        record(stopped=True)
        return True


dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
bus = dbus.bus.BusConnection(BUS_ADDRESS)
name = dbus.service.BusName(NAME, bus)
RegisterServer(bus, "/com/redhat/RHSM1/RegisterServer")
print("ready", flush=True)
GLib.MainLoop().run()

"""``kubevol csi SERVICE COMMAND``: csc for Python.

:mod:`.command` builds the command tree and runs a call; :mod:`.identity`,
:mod:`.controller`, :mod:`.node`, :mod:`.group` and :mod:`.snapshot_metadata` hold one
small function per RPC;
:mod:`.common` what those share; :mod:`.inputs` the parsers of what users type.
Nothing here imports grpc until a command runs.
"""

"""Mount a pod's in-memory emptyDir volume with kubevol, look at it, and tear it down.

Run as root (an in-memory emptyDir is a tmpfs mount), best in a private mount namespace:
    sudo unshare -m --propagation private python examples/library.py
"""

import os
import shutil
import tempfile

from kubernetes.client import V1ObjectMeta, V1Pod

import kubevol
from kubevol.plugins import builtin_plugins

# Set-up: a throw-away kubelet-style root (a real agent would use /var/lib/kubelet).
root = tempfile.mkdtemp(prefix="kubevol-example-")
host = kubevol.NodeVolumeHost(root_dir=root, node_name="node-1")
mgr = kubevol.VolumePluginMgr()
mgr.init_plugins(builtin_plugins(), host=host)

# The pod and its volume, as in a pod manifest.
pod = V1Pod(metadata=V1ObjectMeta(name="web", namespace="default", uid="0d4c1e9a-web"))
spec = kubevol.Spec.from_manifest("name: scratch\nemptyDir: {medium: Memory, sizeLimit: 64Mi}\n")

plugin = mgr.find_plugin_by_spec(spec)  # kubernetes.io/empty-dir
mounter = plugin.new_mounter(spec, pod, kubevol.VolumeOptions())
mounter.set_up(kubevol.MounterArgs(fs_group=2000))
path = mounter.get_path()
print(f"{plugin.get_plugin_name()} mounted {spec.name()} at {path}: {os.path.ismount(path)}")
with open(os.path.join(path, "hello.txt"), "wb") as f:
    f.write(b"x" * (1 << 20))
print(f"used {mounter.get_metrics().used} bytes")  # 1 MiB, as the kubelet would measure it

# Tear-down: unmount and remove the volume, then the throw-away root.
plugin.new_unmounter(spec.name(), pod.metadata.uid).tear_down()
print(f"after tear-down: {path} exists: {os.path.exists(path)}")
shutil.rmtree(root)  # what is left is the pod's empty directories; nothing is mounted

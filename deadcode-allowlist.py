"""What vulture reports as unused in kubevol/ but is not dead, each with its reason
(``make deadcode``: ``vulture kubevol deadcode-allowlist.py``).

vulture sees callers inside ``kubevol/`` only. A name belongs here when something else
calls it: a library or protocol (http.server, gRPC, pytest, argparse), or users -- the
public API that mirrors the kubelet's contracts, and ``kubevol.testing``'s shipped doubles,
whose callers are tests. A name is allowed wherever it appears; keep entries specific.
"""
# ruff: noqa: B018 -- a vulture allow-list is attribute reads that mark names as used

from typing import Any

_: Any = None

# --- called by a library or protocol ------------------------------------------------
_.__getattr__  # PEP 562 module attribute hook (lazy public names)
_.__dir__  # PEP 562: dir() of a module with lazy names
_.formatter_class  # read by argparse
_.intercept_unary_unary  # grpc.UnaryUnaryClientInterceptor
_.intercept_unary_stream  # grpc.UnaryStreamClientInterceptor
_.intercept_service  # grpc.ServerInterceptor
_.pytest_addoption  # pytest plugin hook (the kubevol-csi-sanity entry point)
_.pytest_cmdline_main  # pytest plugin hook
_.pytest_collection_modifyitems  # pytest plugin hook
_.pytest_runtest_makereport  # pytest plugin hook
_.do_GET  # http.server dispatches do_<METHOD>
_.do_POST  # http.server (kubevol.testing.kube_api)
_.do_PUT  # http.server (kubevol.testing.kube_api)
_.do_PATCH  # http.server (kubevol.testing.kube_api)
_.do_DELETE  # http.server (kubevol.testing.kube_api)
_.log_message  # http.server's request logging, overridden
_.address_string  # http.server, overridden (unix socket peers have no address)
_.protocol_version  # http.server: HTTP/1.1 for watches
_.close_connection  # http.server: ends a kept-alive connection
_.handle_error  # socketserver, overridden
_.daemon_threads  # socketserver.ThreadingMixIn setting
_.block_on_close  # socketserver.ThreadingMixIn setting
_.request_queue_size  # socketserver setting
_.poll_interval  # socketserver's serve_forever parameter, kept by its override (httpbounds)
_.HasFileno  # a _typeshed protocol named in a cast (httpbounds)
_.readinto  # io.RawIOBase protocol
_.collect  # prometheus_client custom collector protocol
_.popitem  # MutableMapping protocol of the engine's tracked tables
_.exc_type  # __exit__ signature
_.tb  # __exit__ signature
_.mtime_ns  # attrs field compared through equality (a socket replaced in place)

# --- parameters of the kubelet's contracts (abstract signatures plugins implement) --
_.old_size  # ExpandableVolumePlugin.expand_volume_device, NodeExpansion options
_.map_path  # BlockVolumeMapper/BlockVolumeUnmapper signatures
_.allowed_topologies  # Provisioner.provision signature
_.selected_node  # Provisioner.provision signature
_.volumes_by_node  # BulkVolumeVerifier.bulk_verify_volumes signature

# --- public API: the kubelet's contracts, for plugin authors and node agents --------
_.find_persistent_plugin_by_spec  # VolumePluginMgr, as pkg/volume's
_.find_persistent_plugin_by_name  # VolumePluginMgr
_.find_recyclable_plugin_by_spec  # VolumePluginMgr
_.find_provisionable_plugin_by_name  # VolumePluginMgr
_.find_creatable_plugin_by_spec  # VolumePluginMgr
_.find_deletable_plugin_by_spec  # VolumePluginMgr
_.find_deletable_plugin_by_name  # VolumePluginMgr
_.find_volume_plugin_with_limits_by_spec  # VolumePluginMgr
_.find_attachable_plugin_by_spec  # VolumePluginMgr
_.find_device_mountable_plugin_by_spec  # VolumePluginMgr
_.find_expandable_plugin_by_spec  # VolumePluginMgr
_.find_expandable_plugin_by_name  # VolumePluginMgr
_.find_mapper_plugin_by_spec  # VolumePluginMgr
_.find_node_expandable_plugin_by_spec  # VolumePluginMgr
_.list_volume_plugin_with_limits  # VolumePluginMgr
_.get_host_name  # VolumeHost
_.get_exec  # VolumeHost
_.get_event_recorder  # VolumeHost
_.set_kubelet_error  # VolumeHost
_.get_csi_node  # VolumeHost (CSI plugin host)
_.list_volume_attachments  # VolumeHost (CSI plugin host)
_.is_attach_detach_controller  # VolumeHost (CSI plugin host)
_.supports_selinux_context_mount  # VolumePlugin
_.get_access_modes  # PersistentVolumePlugin
_.recycle  # RecyclableVolumePlugin
_.new_deleter  # DeletableVolumePlugin
_.new_provisioner  # ProvisionableVolumePlugin
_.provision  # Provisioner
_.get_volume_limits  # VolumePluginWithAttachLimits
_.volume_limit_key  # VolumePluginWithAttachLimits
_.bulk_verify_volumes  # BulkVolumeVerifier
_.can_mount  # Mounter
_.get_attributes  # Mounter
_.volumes_are_attached  # Attacher
_.get_staging_path  # BlockVolumeMapper (CustomBlockVolumeMapper)
_.AttachedByNode  # the type of volumes_are_attached's result, for implementers
_.ALWAYS  # FSGroupChangePolicy value
_.desired_size  # NodeResizeOptions field
_.selinux_relabel  # MounterArgs field
_.cluster_name  # VolumeOptions field
_.cloud_tags  # VolumeOptions field
_.recycler_pod_template  # VolumeConfig field
_.recycler_minimum_timeout  # VolumeConfig field
_.recycler_timeout_increment  # VolumeConfig field
_.other_attributes  # VolumeConfig field
_.provisioning_enabled  # VolumeConfig field
_.csi_volume_phase  # NodeResizeOptions field
_.inline_volume_spec_for_csi_migration  # Spec field
_.migrated  # Spec field

# --- public API: the CSI protocol and the Nomad side, for users ---------------------
_.OFFLINE  # VolumeExpansionType value of the spec
_.VARIABLE_LENGTH  # BlockMetadataType value of the spec
_.node_supports  # CSIClient: ask a node capability
_.channel_open  # CSIClient: whether its channel is open (closed while idle, close_if_idle)
_.is_final  # CSIRPCError: the retry meaning of a status
_.topology_requirement_from_pb  # kubevol.csi.convert pair of topology_requirement_to_pb
_.provider_version  # nomad CSIInfo field (Nomad's)
_.requires_controller_plugin  # nomad CSIInfo field
_.requires_topologies  # nomad CSIInfo field
_.controller_info  # nomad CSIInfo field
_.update_time  # nomad CSIInfo field
_.subsystem  # nomad types field
_.is_device  # nomad MountInfo field
_.supports_stats  # nomad node capabilities
_.supports_expand  # nomad node capabilities
_.supports_condition  # nomad node capabilities
_.seq  # nomad RegistryEvent field (event order, for watchers)
_.dispense  # nomad plugin registry
_.check_all  # nomad checker
_.mounter_for_plugin  # nomad CSI manager
_.mount_volume  # nomad per-allocation volume manager
_.unmount_volume  # nomad per-allocation volume manager
_.has_mount  # nomad per-allocation volume manager
_.wait_registered  # nomad supervisor
_.forget_pod  # TokenManager (also: no node-side caller drops a gone pod's tokens)
_.pod_subpath_dir  # kubevol.layout: every kubelet path, built and described
_.get_project_id  # kubevol.metrics.quota pair of set_project_id
_.set_project_id  # kubevol.metrics.quota: what a directory is measured by
_.native_available  # kubevol.metrics.walk: whether the C walker is built
_.from_file  # LocalCSIDrivers, documented beside from_yaml
_.wait_for_status  # plugin registration server

# --- kubevol.testing: shipped test doubles and rigs (their callers are tests) -------
_.CallClock
_.GlusterServer
_.startup_seconds
_.cleanup_seconds
_.client_pid
_.brick_pids
_.stop_server
_.write_kubeconfig
_.fail_next
_.add_csidriver
_.add_secret
_.add_config_map
_.add_service_account
_.add_node
_.compact
_.send_bookmark
_.drop_watches
_.wait_for_watches
_.set_attached
_.set_attach_error
_.set_detach_error
_.finish_detach
_.non_pod_paths
_.volumes_of
_.build_kubelet_root
_.MountChurn
_.cycles
_.unmount_all_under
_.rbind
_.device_alias
_.KubeletTree
_.global_mount
_.pod_mount
_.Overlap
_.wait_until
_.seen_metadata
_.seen_request_ids
_.init_calls

# --- reviewed in node/, mount/ and csidriver/ ---------------------------------------
_.SPECS  # csidriver/sanity/coverage.py: the csi-sanity spec list, public for driver authors
_.run_suite  # csidriver/sanity/runner.py: called by the tests `kubevol driver new` writes
_.require_node_id  # csidriver/server/config.py: X_CSI_REQUIRE_NODE_ID parsed; not enforced yet
_.ping  # csidriver/locks/etcd.py: public, for a driver that checks etcd at start-up
_.held_count  # csidriver/locks/inprocess.py: public, what a lock provider holds
_.format_and_mount  # mount/format.py: mount-utils' FormatAndMount, public API
_.table_reads  # mount/guard.py: a read counter, the counting tests' window on the cache
_.super_options  # mount/mountinfo.py: a mountinfo field, public data
_.from_text  # mount/table.py: public constructor (a table from a fixture's text)
_.running_pods  # node/agent.py: public, what an embedding program asks its agent
_.lists  # node/api_pods.py: counters of relists and watches, read by tests and embedders
_.watches
_.refreshed  # node/exporter.py: when stats were last refreshed, read by tests
_.kubelet_errors  # node/host.py: the reading side of VolumeHost.set_kubelet_error
_.pod_mounts  # node/mountcheck.py: public, one pod of mounts_by_pod
_.records_for  # node/records.py: public, records built from manifests
_.open_node  # node/runtime.py: the library's documented entry point
_.NORMAL  # k8s/events.py: public, the event type besides WARNING
_.example  # cli/down.py: a key of the _PodRow TypedDict, read as row["example"]

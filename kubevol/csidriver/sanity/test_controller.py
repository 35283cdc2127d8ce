"""Controller service: volumes, capacity, validation, attach, expansion, modification."""

from __future__ import annotations

from functools import partial

import pytest

from kubevol.csi import convert, pb
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.sanity.checks import Code, expect_code, expect_code_in, need_controller
from kubevol.csidriver.sanity.context import Resources, SanityContext, repeat, unique_name

CC = t.ControllerCapability


def test_controller_capabilities_are_known(csi_sanity: SanityContext) -> None:
    """ControllerGetCapabilities answers only capabilities the spec defines (not UNKNOWN).

    csi-sanity v5.3 also fails GET_SNAPSHOT (15, alpha), which the spec defines but it does
    not know; this suite follows the spec and accepts it."""
    need_controller(csi_sanity)
    raw = csi_sanity.controller.call(
        "ControllerGetCapabilities", csi_pb2.ControllerGetCapabilitiesRequest()
    )
    assert isinstance(raw, pb.ControllerGetCapabilitiesResponse), type(raw)
    known = frozenset(int(v) for v in CC if v)
    for cap in raw.capabilities:
        assert cap.WhichOneof("type") == "rpc", f"unknown controller capability {cap}"
        assert cap.rpc.type in known, f"unknown controller capability {cap.rpc.type}"


def test_get_capacity(csi_sanity: SanityContext) -> None:
    """GetCapacity answers, with and without a capability, never a negative figure."""
    need_controller(csi_sanity, CC.GET_CAPACITY)
    c = csi_sanity.controller
    assert c.get_capacity().available_capacity >= 0
    cap = c.get_capacity(capabilities=[csi_sanity.capability()])
    assert cap.available_capacity >= 0


# --- CreateVolume / DeleteVolume ------------------------------------------------------


def test_create_volume_requires_name_and_capabilities(csi_sanity: SanityContext) -> None:
    """CreateVolume without a name or without capabilities is INVALID_ARGUMENT."""
    need_controller(csi_sanity, CC.CREATE_DELETE_VOLUME)
    c = csi_sanity.controller
    secrets = csi_sanity.secrets("CreateVolume")
    no_name = csi_pb2.CreateVolumeRequest(secrets=secrets)
    no_name.volume_capabilities.add().mount.SetInParent()
    no_name.volume_capabilities[0].access_mode.mode = 1
    expect_code(Code.INVALID_ARGUMENT, lambda: c.call("CreateVolume", no_name))
    no_caps = csi_pb2.CreateVolumeRequest(name=unique_name("nocaps"), secrets=secrets)
    expect_code(Code.INVALID_ARGUMENT, lambda: c.call("CreateVolume", no_caps))


def test_create_volume_is_idempotent(csi_sanity: SanityContext, csi_resources: Resources) -> None:
    """The same name and arguments answer the same volume, of at least the asked size."""
    need_controller(csi_sanity, CC.CREATE_DELETE_VOLUME)
    name = unique_name("twice")
    vol = repeat(csi_sanity.config.idempotent_count, lambda: csi_resources.create_volume(name))
    assert vol.volume_id
    assert vol.capacity_bytes == 0 or vol.capacity_bytes >= csi_sanity.config.volume_size


def test_create_volume_without_capacity(csi_resources: Resources) -> None:
    """CreateVolume without a capacity range succeeds."""
    need_controller(csi_resources.ctx, CC.CREATE_DELETE_VOLUME)
    ctx = csi_resources.ctx
    vol = ctx.controller.create_volume(
        unique_name("nocap"),
        [ctx.capability()],
        parameters=ctx.config.parameters,
        secrets=ctx.secrets("CreateVolume"),
    )
    csi_resources.volumes.append(vol.volume_id)
    assert vol.volume_id


def test_same_name_other_size_already_exists(csi_resources: Resources) -> None:
    """A name reused with a size the volume cannot satisfy is ALREADY_EXISTS."""
    need_controller(csi_resources.ctx, CC.CREATE_DELETE_VOLUME)
    name = unique_name("resize")
    size = csi_resources.ctx.config.volume_size
    csi_resources.create_volume(name, size=size)
    bigger = 2 * size
    rng = t.CapacityRange(required_bytes=bigger, limit_bytes=bigger)
    expect_code(Code.ALREADY_EXISTS, lambda: csi_resources.create_volume(name, capacity_range=rng))


def test_maximum_length_name(csi_resources: Resources) -> None:
    """A 128-character name (the spec's limit) is accepted."""
    need_controller(csi_resources.ctx, CC.CREATE_DELETE_VOLUME)
    assert csi_resources.create_volume("v" * 128).volume_id


def test_delete_volume(csi_sanity: SanityContext, csi_resources: Resources) -> None:
    """DeleteVolume needs an id, answers OK for an unknown one, and is idempotent."""
    need_controller(csi_sanity, CC.CREATE_DELETE_VOLUME)
    c = csi_sanity.controller
    secrets = csi_sanity.secrets("DeleteVolume")
    req = csi_pb2.DeleteVolumeRequest(secrets=secrets)
    expect_code(Code.INVALID_ARGUMENT, lambda: c.call("DeleteVolume", req))
    c.delete_volume(unique_name("never-created"), secrets=secrets)
    vol = csi_resources.create_volume()
    repeat(
        csi_sanity.config.idempotent_count, lambda: c.delete_volume(vol.volume_id, secrets=secrets)
    )


def test_create_from_unknown_source_is_not_found(csi_resources: Resources) -> None:
    """A content source that does not exist is NOT_FOUND."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.CREATE_DELETE_VOLUME, CC.CREATE_DELETE_SNAPSHOT)
    src = t.SnapshotSource(snapshot_id=unique_name("no-snapshot"))
    expect_code(Code.NOT_FOUND, lambda: csi_resources.create_volume(content_source=src))


def test_clone_volume(csi_resources: Resources) -> None:
    """A volume cloned from another names it as its content source."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.CREATE_DELETE_VOLUME, CC.CLONE_VOLUME)
    src = csi_resources.create_volume()
    clone = csi_resources.create_volume(content_source=t.VolumeSource(volume_id=src.volume_id))
    assert clone.volume_id != src.volume_id
    assert clone.content_source == t.VolumeSource(volume_id=src.volume_id)
    missing = t.VolumeSource(volume_id=unique_name("no-volume"))
    expect_code(Code.NOT_FOUND, lambda: csi_resources.create_volume(content_source=missing))


# --- ListVolumes ------------------------------------------------------------------------


def test_list_volumes_shows_new_and_hides_deleted(csi_resources: Resources) -> None:
    """A created volume is listed, a deleted one no longer; every entry has an id.

    csi-sanity counts the entries before and after; this suite looks for the volume itself,
    so a driver shared with other users still passes."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.LIST_VOLUMES, CC.CREATE_DELETE_VOLUME)
    c = ctx.controller
    vol = csi_resources.create_volume()

    def listed() -> set[str]:
        ids: set[str] = set()
        token = ""
        while True:
            page = c.list_volumes(starting_token=token)
            ids |= {e.volume.volume_id for e in page.entries}
            token = page.next_token
            if not token:
                return ids

    assert vol.volume_id in listed()
    c.delete_volume(vol.volume_id, secrets=ctx.secrets("DeleteVolume"))
    assert vol.volume_id not in listed()
    raw = c.call("ListVolumes", csi_pb2.ListVolumesRequest())
    assert isinstance(raw, pb.ListVolumesResponse), type(raw)
    assert all(entry.volume.volume_id for entry in raw.entries), "a listed volume has no id"


def test_list_volumes_pages(csi_resources: Resources) -> None:
    """max_entries limits a page and next_token continues without repeats."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.LIST_VOLUMES, CC.CREATE_DELETE_VOLUME)
    made = {csi_resources.create_volume().volume_id for _ in range(3)}
    seen: list[str] = []
    token = ""
    for _ in range(1000):
        page = ctx.controller.list_volumes(max_entries=2, starting_token=token)
        assert len(page.entries) <= 2
        seen += [e.volume.volume_id for e in page.entries]
        token = page.next_token
        if not token:
            break
    assert len(seen) == len(set(seen)), "a volume was listed twice"
    assert made <= set(seen)


def test_list_volumes_invalid_token_is_aborted(csi_sanity: SanityContext) -> None:
    """An unknown starting_token is ABORTED (many drivers wrongly answer INVALID_ARGUMENT)."""
    need_controller(csi_sanity, CC.LIST_VOLUMES)
    expect_code(
        Code.ABORTED, lambda: csi_sanity.controller.list_volumes(starting_token="invalid-token")
    )


# --- ValidateVolumeCapabilities -------------------------------------------------------


def test_validate_volume_capabilities(csi_sanity: SanityContext, csi_resources: Resources) -> None:
    """Validation needs an id and capabilities, is NOT_FOUND for an unknown volume and
    confirms the capability a volume was created with."""
    need_controller(csi_sanity, CC.CREATE_DELETE_VOLUME)
    c = csi_sanity.controller
    secrets = csi_sanity.secrets("ValidateVolumeCapabilities")
    no_id = csi_pb2.ValidateVolumeCapabilitiesRequest(secrets=secrets)
    expect_code(Code.INVALID_ARGUMENT, lambda: c.call("ValidateVolumeCapabilities", no_id))
    vol = csi_resources.create_volume()
    no_caps = csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id=vol.volume_id, secrets=secrets)
    expect_code(Code.INVALID_ARGUMENT, lambda: c.call("ValidateVolumeCapabilities", no_caps))
    cap = csi_sanity.capability()
    expect_code(
        Code.NOT_FOUND,
        lambda: c.validate_volume_capabilities(unique_name("none"), [cap], secrets=secrets),
    )
    result = c.validate_volume_capabilities(
        vol.volume_id,
        [cap],
        volume_context=vol.volume_context,
        parameters=csi_sanity.config.parameters,
        secrets=secrets,
    )
    assert result.confirmed is not None, f"not confirmed: {result.message}"
    assert cap in result.confirmed.volume_capabilities


# --- ControllerPublish / Unpublish ----------------------------------------------------


def test_controller_publish_requires_fields(csi_sanity: SanityContext) -> None:
    """ControllerPublish without volume id, node id or capability is INVALID_ARGUMENT;
    ControllerUnpublish without a volume id too."""
    need_controller(csi_sanity, CC.PUBLISH_UNPUBLISH_VOLUME)
    c = csi_sanity.controller
    cap = convert.capability_to_pb(csi_sanity.capability())
    node = csi_sanity.node_id
    for req in (
        csi_pb2.ControllerPublishVolumeRequest(node_id=node, volume_capability=cap),
        csi_pb2.ControllerPublishVolumeRequest(volume_id="v", volume_capability=cap),
        csi_pb2.ControllerPublishVolumeRequest(volume_id="v", node_id=node),
    ):
        expect_code(Code.INVALID_ARGUMENT, partial(c.call, "ControllerPublishVolume", req))
    expect_code(
        Code.INVALID_ARGUMENT,
        lambda: c.call("ControllerUnpublishVolume", csi_pb2.ControllerUnpublishVolumeRequest()),
    )


def test_controller_publish_unknown_volume_or_node(
    csi_sanity: SanityContext, csi_resources: Resources
) -> None:
    """Publishing an unknown volume, or to an unknown node, is NOT_FOUND."""
    need_controller(csi_sanity, CC.PUBLISH_UNPUBLISH_VOLUME, CC.CREATE_DELETE_VOLUME)
    c = csi_sanity.controller
    cap = csi_sanity.capability()
    secrets = csi_sanity.secrets("ControllerPublishVolume")
    expect_code(
        Code.NOT_FOUND,
        lambda: c.controller_publish_volume(
            unique_name("none"), csi_sanity.node_id, cap, secrets=secrets
        ),
    )
    vol = csi_resources.create_volume()
    expect_code(
        Code.NOT_FOUND,
        lambda: c.controller_publish_volume(
            vol.volume_id, unique_name("no-node"), cap, secrets=secrets
        ),
    )


def test_controller_publish_incompatible_is_already_exists(csi_resources: Resources) -> None:
    """With PUBLISH_READONLY, publishing an attached volume again read-only is
    ALREADY_EXISTS."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.PUBLISH_UNPUBLISH_VOLUME, CC.PUBLISH_READONLY, CC.CREATE_DELETE_VOLUME)
    vol = csi_resources.create_volume()
    csi_resources.attach(vol.volume_id)
    expect_code(
        Code.ALREADY_EXISTS,
        lambda: ctx.controller.controller_publish_volume(
            vol.volume_id,
            ctx.node_id,
            ctx.capability(),
            readonly=True,
            secrets=ctx.secrets("ControllerPublishVolume"),
        ),
    )


def test_controller_publish_respects_the_node_attach_limit(csi_resources: Resources) -> None:
    """With ``--csi-test-node-volume-attach-limit``: NodeGetInfo's max_volumes_per_node
    volumes attach, one more fails."""
    ctx = csi_resources.ctx
    if not ctx.config.test_node_volume_attach_limit:
        pytest.skip("--csi-test-node-volume-attach-limit is not given")
    need_controller(ctx, CC.PUBLISH_UNPUBLISH_VOLUME, CC.CREATE_DELETE_VOLUME)
    limit = ctx.node_info.max_volumes_per_node
    if limit <= 0:
        pytest.skip("NodeGetInfo reports no max_volumes_per_node")
    for _ in range(limit):
        csi_resources.attach(csi_resources.create_volume().volume_id)
    extra = csi_resources.create_volume().volume_id
    with pytest.raises(CSIRPCError):
        csi_resources.attach(extra)


def test_controller_volume_lifecycle(csi_resources: Resources) -> None:
    """A volume created for this node's topology (when it reports one) attaches, repeatably;
    the cleanup detaches and deletes it."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.PUBLISH_UNPUBLISH_VOLUME, CC.CREATE_DELETE_VOLUME)
    vol = csi_resources.create_volume(accessibility_requirements=ctx.topology_requirement())
    repeat(ctx.config.idempotent_count, lambda: csi_resources.attach(vol.volume_id))


def test_controller_publish_is_idempotent(csi_resources: Resources) -> None:
    """Publishing twice to the same node answers the same context; unpublishing twice,
    or a volume never published, answers OK."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.PUBLISH_UNPUBLISH_VOLUME, CC.CREATE_DELETE_VOLUME)
    vol = csi_resources.create_volume()
    repeat(ctx.config.idempotent_count, lambda: csi_resources.attach(vol.volume_id))
    secrets = ctx.secrets("ControllerUnpublishVolume")
    unpublish = ctx.controller.controller_unpublish_volume
    repeat(
        ctx.config.idempotent_count,
        lambda: unpublish(vol.volume_id, ctx.node_id, secrets=secrets),
    )
    other = csi_resources.create_volume()
    unpublish(other.volume_id, ctx.node_id, secrets=secrets)


# --- ControllerGetVolume, Expand, Modify ---------------------------------------------


def test_controller_get_volume(csi_sanity: SanityContext, csi_resources: Resources) -> None:
    """ControllerGetVolume answers a created volume and NOT_FOUND for an unknown one."""
    need_controller(csi_sanity, CC.GET_VOLUME, CC.CREATE_DELETE_VOLUME)
    c = csi_sanity.controller
    vol = csi_resources.create_volume()
    assert c.controller_get_volume(vol.volume_id).volume.volume_id == vol.volume_id
    expect_code(Code.NOT_FOUND, lambda: c.controller_get_volume(unique_name("none")))


def test_controller_expand_volume(csi_sanity: SanityContext, csi_resources: Resources) -> None:
    """Expansion needs an id and a range; it grows to at least the size asked, repeatably.

    csi-sanity wants exactly the size asked; the spec lets a driver round up, and this
    suite follows the spec."""
    need_controller(csi_sanity, CC.EXPAND_VOLUME, CC.CREATE_DELETE_VOLUME)
    c = csi_sanity.controller
    no_range = csi_pb2.ControllerExpandVolumeRequest(volume_id="v")
    expect_code(Code.INVALID_ARGUMENT, lambda: c.call("ControllerExpandVolume", no_range))
    no_id = csi_pb2.ControllerExpandVolumeRequest()
    no_id.capacity_range.required_bytes = 1
    expect_code(Code.INVALID_ARGUMENT, lambda: c.call("ControllerExpandVolume", no_id))
    vol = csi_resources.create_volume()
    size = csi_sanity.config.expanded_size
    result = repeat(
        csi_sanity.config.idempotent_count,
        lambda: (
            c.controller_expand_volume(
                vol.volume_id,
                t.CapacityRange(required_bytes=size),
                secrets=csi_sanity.secrets("ControllerExpandVolume"),
            ).capacity_bytes
        ),
    )
    assert result >= size


def test_controller_modify_volume(csi_sanity: SanityContext, csi_resources: Resources) -> None:
    """Modify needs a volume id, is NOT_FOUND for an unknown volume (with or without
    parameters), refuses keys the driver does not know (INVALID_ARGUMENT) and applies the
    configured mutable parameters repeatably, to volumes created with or without them.

    The spec calls ``mutable_parameters`` REQUIRED, but an empty map is the same bytes as
    an absent one: a driver may answer it OK (csi-sanity expects that) or INVALID_ARGUMENT.
    """
    need_controller(csi_sanity, CC.MODIFY_VOLUME, CC.CREATE_DELETE_VOLUME)
    c = csi_sanity.controller
    params = dict(csi_sanity.config.mutable_parameters)
    secrets = csi_sanity.secrets("ControllerModifyVolume")
    no_id = csi_pb2.ControllerModifyVolumeRequest(mutable_parameters=params, secrets=secrets)
    expect_code(Code.INVALID_ARGUMENT, lambda: c.call("ControllerModifyVolume", no_id))
    unknown = unique_name("none")
    expect_code(Code.NOT_FOUND, lambda: c.controller_modify_volume(unknown, params))
    vol = csi_resources.create_volume()
    empty = csi_pb2.ControllerModifyVolumeRequest(volume_id=vol.volume_id, secrets=secrets)
    expect_code_in(
        (Code.OK, Code.INVALID_ARGUMENT), lambda: c.call("ControllerModifyVolume", empty)
    )
    fake = {"XXX_FakeKey": "XXX_FakeValue"}
    expect_code(
        Code.INVALID_ARGUMENT,
        lambda: c.controller_modify_volume(vol.volume_id, fake, secrets=secrets),
    )
    if not params:
        return  # nothing known to be valid for this driver: the positive case needs a file
    for vid in (vol.volume_id, csi_resources.create_volume(mutable_parameters=params).volume_id):
        repeat(
            csi_sanity.config.idempotent_count,
            partial(c.controller_modify_volume, vid, params, secrets=secrets),
        )
        expect_code(
            Code.INVALID_ARGUMENT,
            partial(c.controller_modify_volume, vid, fake, secrets=secrets),
        )


def test_create_volume_with_volume_attributes_class(csi_resources: Resources) -> None:
    """With MODIFY_VOLUME advertised, CreateVolume accepts the configured mutable
    parameters and refuses a key the driver does not know (INVALID_ARGUMENT)."""
    need_controller(csi_resources.ctx, CC.MODIFY_VOLUME, CC.CREATE_DELETE_VOLUME)
    params = dict(csi_resources.ctx.config.mutable_parameters)
    assert csi_resources.create_volume(mutable_parameters=params).volume_id
    fake = {"XXX_FakeKey": "XXX_FakeValue"}
    expect_code(
        Code.INVALID_ARGUMENT, lambda: csi_resources.create_volume(mutable_parameters=fake)
    )

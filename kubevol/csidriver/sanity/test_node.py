"""Node service: staging, publishing, stats, expansion, and the full volume lifecycle."""

from __future__ import annotations

import os
from functools import partial

import pytest

from kubevol.csi import convert
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csidriver.sanity.checks import (
    Code,
    expect_code,
    expect_code_in,
    need_controller,
    need_node,
)
from kubevol.csidriver.sanity.context import (
    PathKind,
    Publication,
    Resources,
    SanityContext,
    repeat,
    unique_name,
)

NC = t.NodeCapability
CC = t.ControllerCapability


def _need_volumes(ctx: SanityContext) -> None:
    need_controller(ctx, CC.CREATE_DELETE_VOLUME)


def test_node_publish_requires_fields(csi_resources: Resources) -> None:
    """NodePublish without volume id, target path or capability is INVALID_ARGUMENT."""
    ctx = csi_resources.ctx
    cap = convert.capability_to_pb(ctx.capability())
    target = csi_resources.target_path
    for req in (
        csi_pb2.NodePublishVolumeRequest(target_path=target, volume_capability=cap),
        csi_pb2.NodePublishVolumeRequest(volume_id="v", volume_capability=cap),
        csi_pb2.NodePublishVolumeRequest(volume_id="v", target_path=target),
    ):
        expect_code(Code.INVALID_ARGUMENT, partial(ctx.client.call, "NodePublishVolume", req))


def test_node_unpublish_requires_fields_and_accepts_unknown(csi_resources: Resources) -> None:
    """NodeUnpublish needs volume id and target path; for a volume that does not exist the
    spec's error table says NOT_FOUND and its idempotency rule allows OK: either passes
    (csi-sanity's cleanup accepts both too)."""
    ctx = csi_resources.ctx
    for req in (
        csi_pb2.NodeUnpublishVolumeRequest(target_path=csi_resources.target_path),
        csi_pb2.NodeUnpublishVolumeRequest(volume_id="v"),
    ):
        expect_code(Code.INVALID_ARGUMENT, partial(ctx.client.call, "NodeUnpublishVolume", req))
    expect_code_in(
        (Code.OK, Code.NOT_FOUND),
        lambda: ctx.client.node_unpublish_volume(unique_name("never"), csi_resources.target_path),
    )


def test_node_stage_requires_fields(csi_resources: Resources) -> None:
    """NodeStage without volume id, staging path or capability is INVALID_ARGUMENT;
    NodeUnstage without volume id or path too; unstaging a volume that does not exist is
    OK or NOT_FOUND (the spec's idempotency rule, and its error table)."""
    ctx = csi_resources.ctx
    need_node(ctx, NC.STAGE_UNSTAGE_VOLUME)
    cap = convert.capability_to_pb(ctx.capability())
    staging = csi_resources.staging_path
    vid = csi_resources.create_volume().volume_id if ctx.has_controller_service else "v"
    for req in (
        csi_pb2.NodeStageVolumeRequest(staging_target_path=staging, volume_capability=cap),
        csi_pb2.NodeStageVolumeRequest(volume_id=vid, volume_capability=cap),
        csi_pb2.NodeStageVolumeRequest(volume_id=vid, staging_target_path=staging),
    ):
        expect_code(Code.INVALID_ARGUMENT, partial(ctx.client.call, "NodeStageVolume", req))
    for unstage in (
        csi_pb2.NodeUnstageVolumeRequest(staging_target_path=staging),
        csi_pb2.NodeUnstageVolumeRequest(volume_id=vid),
    ):
        expect_code(Code.INVALID_ARGUMENT, partial(ctx.client.call, "NodeUnstageVolume", unstage))
    expect_code_in(
        (Code.OK, Code.NOT_FOUND),
        lambda: ctx.client.node_unstage_volume(unique_name("never"), staging),
    )


def test_stats_errors(csi_resources: Resources) -> None:
    """Stats need volume id and path; an unknown volume, or a path the volume is not
    published at, is NOT_FOUND."""
    ctx = csi_resources.ctx
    need_node(ctx, NC.GET_VOLUME_STATS)
    call = partial(ctx.client.call, "NodeGetVolumeStats")
    expect_code(
        Code.INVALID_ARGUMENT, lambda: call(csi_pb2.NodeGetVolumeStatsRequest(volume_path="/p"))
    )
    expect_code(
        Code.INVALID_ARGUMENT, lambda: call(csi_pb2.NodeGetVolumeStatsRequest(volume_id="v"))
    )
    expect_code(
        Code.NOT_FOUND, lambda: ctx.client.node_get_volume_stats(unique_name("none"), "some/path")
    )
    if ctx.has_controller_service:
        _need_volumes(ctx)
        vid = csi_resources.create_volume().volume_id
        csi_resources.make_available(vid)
        expect_code(Code.NOT_FOUND, lambda: ctx.client.node_get_volume_stats(vid, "some/path"))


def test_node_expand_errors(csi_resources: Resources) -> None:
    """NodeExpand needs a volume id and a path; an unknown volume is NOT_FOUND."""
    ctx = csi_resources.ctx
    need_node(ctx, NC.EXPAND_VOLUME)
    call = partial(ctx.client.call, "NodeExpandVolume")
    expect_code(
        Code.INVALID_ARGUMENT, lambda: call(csi_pb2.NodeExpandVolumeRequest(volume_path="/p"))
    )
    vid = csi_resources.create_volume().volume_id if ctx.has_controller_service else "v"
    expect_code(Code.INVALID_ARGUMENT, lambda: call(csi_pb2.NodeExpandVolumeRequest(volume_id=vid)))
    expect_code(
        Code.NOT_FOUND, lambda: ctx.client.node_expand_volume(unique_name("none"), "some/path")
    )


def test_publish_without_staging_fails(csi_resources: Resources) -> None:
    """A driver that stages refuses to publish a volume that was not staged:
    FAILED_PRECONDITION."""
    ctx = csi_resources.ctx
    need_node(ctx, NC.STAGE_UNSTAGE_VOLUME)
    _need_volumes(ctx)
    vid = csi_resources.create_volume().volume_id
    context = csi_resources.attach(vid)
    expect_code(
        Code.FAILED_PRECONDITION,
        lambda: ctx.client.node_publish_volume(
            vid,
            csi_resources.target_path,
            ctx.capability(),
            staging_target_path=csi_resources.staging_path,
            publish_context=context,
            secrets=ctx.secrets("NodePublishVolume"),
        ),
    )
    if ctx.config.path_commands.can_check:
        assert ctx.path_kind(csi_resources.target_path) is PathKind.NOT_FOUND


def test_node_unpublish_removes_the_target(csi_resources: Resources) -> None:
    """After NodeUnpublish the target path the driver created is gone (the spec: the SP
    MUST delete it). Skipped, as csi-sanity does, when paths are made by a command and no
    check command is given."""
    ctx = csi_resources.ctx
    _need_volumes(ctx)
    if not ctx.config.path_commands.can_check:
        pytest.skip("--csi-create-mount-path-cmd is set without --csi-check-path-cmd")
    vid = csi_resources.create_volume().volume_id
    target = csi_resources.make_available(vid)
    assert ctx.path_kind(target) is not PathKind.NOT_FOUND, "the driver must create the target"
    ctx.client.node_unpublish_volume(vid, target)
    assert ctx.path_kind(target) is PathKind.NOT_FOUND, "NodeUnpublish must remove the target"


def test_single_writer_refuses_a_second_target(csi_resources: Resources) -> None:
    """With SINGLE_NODE_MULTI_WRITER advertised, a SINGLE_NODE_SINGLE_WRITER volume
    published at one target is refused at another: FAILED_PRECONDITION."""
    ctx = csi_resources.ctx
    _need_volumes(ctx)
    need_node(ctx, NC.SINGLE_NODE_MULTI_WRITER)
    cap = ctx.capability(t.AccessMode.SINGLE_NODE_SINGLE_WRITER)
    vid = csi_resources.create_volume(capabilities=[cap]).volume_id
    csi_resources.make_available(vid, cap)
    other = os.path.join(csi_resources.target_parent, "other_target")
    expect_code(
        Code.FAILED_PRECONDITION,
        lambda: ctx.client.node_publish_volume(
            vid,
            other,
            cap,
            staging_target_path=csi_resources.staging_path if ctx.stages else "",
            secrets=ctx.secrets("NodePublishVolume"),
        ),
    )
    csi_resources.publications.append(Publication(vid, other))


def _lifecycle(res: Resources, count: int) -> None:
    """Create, attach, stage and publish (each ``count`` times), check the target and the
    stats, then tear down (each ``count`` times) and check the target is gone."""
    ctx = res.ctx
    vid = res.create_volume(accessibility_requirements=ctx.topology_requirement()).volume_id
    context = repeat(count, lambda: res.attach(vid))
    repeat(count, lambda: res.stage(vid, context))
    target = repeat(count, lambda: res.publish(vid, context))
    checks_paths = ctx.config.path_commands.can_check
    if checks_paths:
        kind = ctx.path_kind(target)
        assert kind is not PathKind.NOT_FOUND, "the driver must create the target path"
        if ctx.config.access_type == "block":
            assert kind is not PathKind.DIRECTORY, "a block target must be a file"
        else:
            assert kind is PathKind.DIRECTORY, "a mount target must be a directory"
    if NC.GET_VOLUME_STATS in ctx.node_caps:
        stats = ctx.client.node_get_volume_stats(vid, target)
        assert stats.usage, "NodeGetVolumeStats must report usage"
        if NC.VOLUME_CONDITION in ctx.node_caps:
            assert stats.volume_condition is not None and not stats.volume_condition.abnormal
    repeat(count, lambda: ctx.client.node_unpublish_volume(vid, target))
    if checks_paths:
        assert ctx.path_kind(target) is PathKind.NOT_FOUND, (
            "NodeUnpublish must remove the target path"
        )
    if ctx.stages:
        repeat(count, lambda: ctx.client.node_unstage_volume(vid, res.staging_path))
    if ctx.attaches:
        repeat(
            count,
            lambda: ctx.controller.controller_unpublish_volume(
                vid, ctx.node_id, secrets=ctx.secrets("ControllerUnpublishVolume")
            ),
        )
    repeat(count, lambda: ctx.controller.delete_volume(vid, secrets=ctx.secrets("DeleteVolume")))


def test_full_lifecycle(csi_resources: Resources) -> None:
    """Create, attach, stage, publish, stats, unpublish, unstage, detach, delete."""
    _need_volumes(csi_resources.ctx)
    _lifecycle(csi_resources, 1)


def test_full_lifecycle_is_idempotent(csi_resources: Resources) -> None:
    """The same lifecycle with every mutating call repeated."""
    _need_volumes(csi_resources.ctx)
    _lifecycle(csi_resources, max(2, csi_resources.ctx.config.idempotent_count))


def test_second_publish_with_other_flags_already_exists(csi_resources: Resources) -> None:
    """Publishing again at the same target with another read-only flag is ALREADY_EXISTS."""
    ctx = csi_resources.ctx
    _need_volumes(ctx)
    vid = csi_resources.create_volume().volume_id
    target = csi_resources.make_available(vid)
    expect_code(
        Code.ALREADY_EXISTS,
        lambda: ctx.client.node_publish_volume(
            vid,
            target,
            ctx.capability(),
            staging_target_path=csi_resources.staging_path if ctx.stages else "",
            readonly=True,
            secrets=ctx.secrets("NodePublishVolume"),
        ),
    )


def test_node_expand_after_publish(csi_resources: Resources) -> None:
    """After a controller expansion (when offered), NodeExpand on the target succeeds."""
    ctx = csi_resources.ctx
    need_node(ctx, NC.EXPAND_VOLUME)
    _need_volumes(ctx)
    vid = csi_resources.create_volume().volume_id
    size = ctx.config.expanded_size
    if CC.EXPAND_VOLUME in ctx.controller_caps:
        grown = ctx.controller.controller_expand_volume(
            vid, t.CapacityRange(required_bytes=size), secrets=ctx.secrets("ControllerExpandVolume")
        )
        assert grown.capacity_bytes >= size
    target = csi_resources.make_available(vid)
    result = ctx.client.node_expand_volume(
        vid, target, capacity_range=t.CapacityRange(required_bytes=size)
    )
    assert result == 0 or result >= size


def test_unstage_and_detach_of_unused_volume_are_ok(csi_resources: Resources) -> None:
    """The cleanup calls on a volume never staged or attached answer OK (csi-test #196)."""
    ctx = csi_resources.ctx
    _need_volumes(ctx)
    vid = csi_resources.create_volume().volume_id
    ctx.client.node_unpublish_volume(vid, csi_resources.target_path)
    if ctx.stages:
        ctx.client.node_unstage_volume(vid, csi_resources.staging_path)
    if ctx.attaches:
        ctx.controller.controller_unpublish_volume(
            vid, ctx.node_id, secrets=ctx.secrets("ControllerUnpublishVolume")
        )

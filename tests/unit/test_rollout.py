"""Which Deployments kube-controller-manager holds in its scaling step, and the annotations that
release them (rollout.py). The state is the one a CI run's decode tier was left in, read back
from that run's etcd: the old ReplicaSet alone has pods, at the Deployment's count, annotated
with the count from before the change."""

from __future__ import annotations

import pytest

from heteroserve_operator.rollout import (
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    desired_annotation,
    held_rollout,
    may_be_held,
    resolve_surge,
)

UID = "d-uid"


def deployment(replicas: int = 1, updated: int = 0, generation: int = 8, observed: int = 8,
               max_surge: int | str | None = 0, paused: bool = False,
               strategy: str = "RollingUpdate", pods: int | None = None) -> dict:
    spec = {"replicas": replicas, "selector": {"matchLabels": {"app": "x"}},
            "strategy": {"type": strategy}}
    if strategy == "RollingUpdate" and max_surge is not None:
        spec["strategy"]["rollingUpdate"] = {"maxSurge": max_surge, "maxUnavailable": 1}
    if paused:
        spec["paused"] = True
    return {"metadata": {"name": "pd-decode", "uid": UID, "generation": generation},
            "spec": spec,
            "status": {"observedGeneration": observed,
                       "replicas": replicas if pods is None else pods,
                       "updatedReplicas": updated, "availableReplicas": replicas}}


def replica_set(name: str, replicas: int, desired: str | None, owner: str = UID,
                controller: bool = True, pods: int | None = None) -> dict:
    annotations = {"deployment.kubernetes.io/revision": "1"}
    if desired is not None:
        annotations[DESIRED_REPLICAS] = desired
        annotations[MAX_REPLICAS] = desired
    return {"metadata": {"name": name, "resourceVersion": "9476", "annotations": annotations,
                         "ownerReferences": [{"uid": owner, "controller": controller}]},
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas if pods is None else pods}}


HELD = [replica_set("pd-decode-5cc7c95c98", 1, "2"), replica_set("pd-decode-68bd48b86f", 0, "2")]


def test_the_ci_runs_decode_tier_is_held_and_released_by_its_annotations():
    held = held_rollout(deployment(), HELD)
    assert held is not None
    assert held.replica_set == "pd-decode-5cc7c95c98" and held.resource_version == "9476"
    assert held.stale_desired == "2"
    assert held.annotations == {DESIRED_REPLICAS: "1", MAX_REPLICAS: "1"}


@pytest.mark.parametrize("change", [
    {"updated": 1},                      # rolled out
    {"observed": 7},                     # the controller has not seen this spec yet
    {"paused": True},                    # a paused Deployment does not roll out
    {"strategy": "Recreate"},            # not a rolling update
    {"pods": 0},                         # new: no pods yet (what a thousand new ones look like)
])
def test_a_deployment_whose_own_status_rules_it_out_costs_no_list(change):
    assert not may_be_held(deployment(**change))
    assert held_rollout(deployment(**change), HELD) is None


@pytest.mark.parametrize("replica_sets", [
    [replica_set("a", 1, "1"), replica_set("b", 0, "1")],       # the annotation is current
    [replica_set("a", 1, "2"), replica_set("b", 1, "2")],       # two with pods: proportional
    [replica_set("a", 2, "2"), replica_set("b", 0, "2")],       # counts differ: it scales
    [replica_set("a", 1, None)],                                # no annotation: no scaling
    [replica_set("a", 1, "two")],                               # not a number: ignored
    [replica_set("a", 1, "2", pods=0)],     # the new ReplicaSet, its pod being created
    [replica_set("a", 1, "2", owner="other")],                  # not this Deployment's
    [replica_set("a", 1, "2", controller=False)],               # not its controller
    [],
])
def test_states_the_controller_gets_out_of_by_itself_are_left_alone(replica_sets):
    assert may_be_held(deployment())
    assert held_rollout(deployment(), replica_sets) is None


def test_max_replicas_counts_the_surge_as_the_controller_does():
    held = held_rollout(deployment(replicas=3, max_surge="25%"),
                        [replica_set("a", 3, "4"), replica_set("b", 0, "4")])
    assert held is not None and held.annotations == {DESIRED_REPLICAS: "3", MAX_REPLICAS: "4"}
    held = held_rollout(deployment(replicas=2, max_surge=None),   # the default, 25 %
                        [replica_set("a", 2, "1")])
    assert held is not None and held.annotations[MAX_REPLICAS] == "3"


@pytest.mark.parametrize(("value", "replicas", "pods"), [
    (0, 5, 0), (2, 5, 2), ("25%", 4, 1), ("25%", 5, 2), ("100%", 3, 3), ("0%", 3, 0),
    (None, 8, 2)])
def test_surge_resolves_like_the_controller(value, replicas, pods):
    assert resolve_surge(value, replicas) == pods


@pytest.mark.parametrize("value", ["1.5", "%", "a%", "-5%"])
def test_a_surge_that_is_no_count_or_percentage_is_refused(value):
    with pytest.raises(ValueError, match="neither a count nor a percentage"):
        resolve_surge(value, 3)


@pytest.mark.parametrize(("value", "read"), [
    ("2", 2), ("0", 0), ("2147483647", 2147483647), ("2147483648", None), (" 2", None),
    ("-2", None), ("+2", None), ("\u0662", None), ("\u00b2", None), ("", None), ("2.0", None)])
def test_the_annotation_is_read_as_the_controller_reads_it(value, read):
    assert desired_annotation(replica_set("a", 1, value)) == read


# -- the reconciler's release step, against a stand-in API (its failure paths) ----------------
class StubKube:
    """The four calls the release step makes. `fresh`: what a consistent read returns (the
    watch cache's answer otherwise); `fail`: an exception the annotate call raises."""

    def __init__(self, replica_sets, fresh_deployment=None, fresh_replica_sets=None,
                 fail: Exception | None = None):
        self.cached, self.fresh_deployment = replica_sets, fresh_deployment
        self.fresh_replica_sets = replica_sets if fresh_replica_sets is None \
            else fresh_replica_sets
        self.fail, self.annotated, self.events = fail, [], []

    def replica_sets(self, namespace, match_labels, consistent=False):
        return self.fresh_replica_sets if consistent else self.cached

    def get(self, kind, namespace, name, consistent=False):
        assert consistent and kind.kind == "Deployment"
        return self.fresh_deployment

    def annotate(self, kind, namespace, name, resource_version, annotations):
        if self.fail is not None:
            raise self.fail
        self.annotated.append((kind.kind, name, resource_version, annotations))

    def event(self, owner, kind, reason, message):
        self.events.append((kind, reason, message))


OWNER = {"metadata": {"name": "pd", "namespace": "ns"}}


def release(kube, deployment_=None):
    from prometheus_client import CollectorRegistry

    from heteroserve_operator.reconcile import Reconciler

    registry = CollectorRegistry()
    reconciler = Reconciler(kube, registry)  # type: ignore[arg-type]
    decode = deployment_ or deployment()
    decode["metadata"]["labels"] = {"app.kubernetes.io/component": "decode"}
    reconciler._release_held_rollouts(OWNER, [decode])
    reconciler._release_held_rollouts(OWNER, [decode])   # a second reconcile
    return registry.get_sample_value("heteroserve_operator_rollouts_released_total",
                                     {"component": "decode"}) or 0


def test_a_hold_confirmed_on_fresh_reads_is_released_with_an_event():
    kube = StubKube(HELD, fresh_deployment=deployment())
    assert release(kube) == 2   # the stand-in's ReplicaSets stay held: released each time
    assert kube.annotated[0] == ("ReplicaSet", "pd-decode-5cc7c95c98", "9476",
                                 {DESIRED_REPLICAS: "1", MAX_REPLICAS: "1"})
    assert [e[:2] for e in kube.events] == [("Normal", "RolloutReleased")] * 2
    assert "desired-replicas 2" in kube.events[0][2] and "#102551" in kube.events[0][2]


def test_a_hold_the_fresh_reads_do_not_confirm_is_left_alone():
    # The cached Deployment says 1 replica; it was scaled to 2 meanwhile.
    kube = StubKube(HELD, fresh_deployment=deployment(replicas=2))
    assert release(kube) == 0 and kube.annotated == [] and kube.events == []
    kube = StubKube(HELD, fresh_deployment=None)   # deleted meanwhile
    assert release(kube) == 0 and kube.annotated == []


@pytest.mark.parametrize("status", [404, 409])
def test_a_replica_set_gone_or_changed_is_left_to_the_controller_silently(status, caplog):
    from heteroserve_operator.kube import ApiError

    kube = StubKube(HELD, fresh_deployment=deployment(), fail=ApiError(status, "x"))
    assert release(kube) == 0 and kube.events == []
    assert "could not" not in caplog.text


@pytest.mark.parametrize("error", ["forbidden", "connection"])
def test_a_hold_that_cannot_be_released_is_logged_and_a_warning_once(error, caplog):
    from heteroserve_operator.kube import ApiError

    fail = ApiError(403, "replicasets is forbidden") if error == "forbidden" \
        else ConnectionError("apiserver went away")
    kube = StubKube(HELD, fresh_deployment=deployment(), fail=fail)
    assert release(kube) == 0   # two reconciles
    assert caplog.text.count("could not check or release the rollout") == 1
    ((kind, reason, message),) = kube.events
    assert (kind, reason) == ("Warning", "RolloutHeld")
    assert "pd-decode-5cc7c95c98" in message and "list and patch of replicasets" in message


def test_a_failed_read_is_logged_once_and_no_event(caplog):
    from heteroserve_operator.kube import ApiError

    class Refusing(StubKube):
        def replica_sets(self, namespace, match_labels, consistent=False):
            raise ApiError(403, "replicasets is forbidden")

    kube = Refusing(HELD, fresh_deployment=deployment())
    assert release(kube) == 0 and kube.events == [] and kube.annotated == []
    assert caplog.text.count("could not check or release the rollout") == 1


def test_a_deployment_deleted_and_made_again_is_warned_about_again(caplog):
    from prometheus_client import CollectorRegistry

    from heteroserve_operator.kube import ApiError
    from heteroserve_operator.reconcile import Reconciler

    kube = StubKube(HELD, fresh_deployment=deployment(), fail=ApiError(403, "forbidden"))
    reconciler = Reconciler(kube, CollectorRegistry())  # type: ignore[arg-type]
    reconciler._release_held_rollouts(OWNER, [deployment()])
    reconciler.forget("Deployment", "ns", "pd-decode")   # its watch's DELETED event
    reconciler._release_held_rollouts(OWNER, [deployment()])
    assert [e[1] for e in kube.events] == ["RolloutHeld", "RolloutHeld"]

"""kube-sim through the Python kubernetes client: list with a label selector, watch from a resourceVersion.

Usage: python3 list_watch.py KUBECONFIG. Exits non-zero with a message on any mismatch.
"""
import sys

from kubernetes import client, config, watch


def main(kubeconfig: str) -> None:
    config.load_kube_config(config_file=kubeconfig)
    v1 = client.CoreV1Api()
    for i in range(6):
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=f"py{i}", labels={"parity": "even" if i % 2 == 0 else "odd"}),
            data={"i": str(i)},
        )
        v1.create_namespaced_config_map("default", body)

    even = v1.list_namespaced_config_map("default", label_selector="parity=even")
    names = sorted(item.metadata.name for item in even.items)
    assert names == ["py0", "py2", "py4"], names
    rv = even.metadata.resource_version
    assert rv, "list has a resourceVersion"

    odd_in = v1.list_namespaced_config_map("default", label_selector="parity in (odd),parity notin (even)")
    assert len(odd_in.items) == 3, [i.metadata.name for i in odd_in.items]

    # Writes after the list; a watch from the list's resourceVersion must replay exactly these
    # (the odd one is outside the selector).
    v1.patch_namespaced_config_map("py0", "default", {"data": {"i": "changed"}})
    v1.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py6", labels={"parity": "even"}))
    )
    v1.delete_namespaced_config_map("py2", "default")
    v1.patch_namespaced_config_map("py1", "default", {"data": {"i": "ignored"}})

    seen = []
    w = watch.Watch()
    for event in w.stream(
        v1.list_namespaced_config_map,
        "default",
        label_selector="parity=even",
        resource_version=rv,
        timeout_seconds=10,
    ):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 3:
            w.stop()
    assert seen == [("MODIFIED", "py0"), ("ADDED", "py6"), ("DELETED", "py2")], seen
    print("ok", seen)


if __name__ == "__main__":
    main(sys.argv[1])

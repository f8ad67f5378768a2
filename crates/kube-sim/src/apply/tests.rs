use super::*;

/// What [`fields_changed_from`] computes in one walk, the way it was computed before: every
/// leaf path of `new`, and those whose lookup from the top differs between the two objects.
fn changes_by_lookup(old: &Value, new: &Value, lt: ListTypes<'_>) -> (FieldSet, FieldSet) {
    let all = fields_of(new, lt);
    let changed = all
        .iter()
        .filter(|p| get_path(old, p) != get_path(new, p))
        .cloned()
        .collect();
    (all, changed)
}

#[test]
fn the_one_walk_finds_the_changes_that_looking_each_path_up_finds() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "a"}, "finalizers": ["x", "y"],
                     "resourceVersion": "7"},
        "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}],
                                 "args": ["--a", "1"]}]},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "c", "ready": false, "restartCount": 0}]}});
    let mut running = pod.clone();
    running["status"] = json!({"phase": "Running", "podIP": "127.10.0.2", "conditions": [
        {"type": "Ready", "status": "True"},
        {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0,
                               "state": {"running": {"startedAt": "now"}}}]});
    let mut relabelled = pod.clone();
    relabelled["metadata"]["labels"] = json!({"app": "b", "tier": "web"});
    relabelled["metadata"]["finalizers"] = json!(["y", "z"]);
    relabelled["spec"]["containers"][0]["args"] = json!(["--a", "2"]);
    let mut emptied = pod.clone();
    emptied["status"] = json!({});
    emptied["spec"]["containers"] = json!([]);
    let mut retyped = pod.clone();
    retyped["status"]["conditions"] = json!("not a list");
    retyped["spec"] = json!([1, 2]);
    for (old, new) in [
        (&pod, &pod),
        (&pod, &running),
        (&running, &pod),
        (&pod, &relabelled),
        (&pod, &emptied),
        (&emptied, &pod),
        (&pod, &retyped),
        (&retyped, &pod),
    ] {
        let lt = ListTypes::builtin();
        assert_eq!(
            fields_changed_from(old, new, lt),
            changes_by_lookup(old, new, lt),
            "from {old} to {new}"
        );
    }
    // A custom resource's own list types, from its schema.
    let schema = json!({"properties": {"spec": {"properties": {
        "ports": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "proto"],
                  "items": {"properties": {"port": {}, "proto": {}, "name": {}}}},
        "tags": {"x-kubernetes-list-type": "set"},
        "steps": {}}}}});
    let lt = ListTypes::from_schema(Some(&schema));
    let a = json!({"spec": {"ports": [{"port": 1, "proto": "TCP", "name": "a"},
                                      {"port": 1, "proto": "UDP", "name": "b"}],
                            "tags": ["x", 1, {"k": "v"}], "steps": ["one", "two"]}});
    let b = json!({"spec": {"ports": [{"port": 1, "proto": "UDP", "name": "c"},
                                      {"port": 2, "proto": "TCP"}],
                            "tags": [1, "y", {"k": "v"}], "steps": ["one"]}});
    for (old, new) in [(&a, &b), (&b, &a), (&a, &a)] {
        assert_eq!(
            fields_changed_from(old, new, lt),
            changes_by_lookup(old, new, lt),
            "from {old} to {new}"
        );
    }
}

#[test]
fn a_new_objects_fields_v1_in_one_walk_is_the_set_of_its_paths_encoded() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "a"}, "annotations": {},
                     "finalizers": ["x", "y", "x"], "uid": "u", "resourceVersion": "7"},
        "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}],
                                 "args": ["--a", "1"], "env": []},
                                {"name": "d", "image": "j", "resources": {}}]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "default"}, "data": {"k": "v", "e": ""}});
    let bare = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
    let retyped = json!({"metadata": "not an object", "spec": [1, 2], "status": null});
    for obj in [&pod, &config_map, &bare, &retyped, &json!("not an object")] {
        let lt = ListTypes::builtin();
        assert_eq!(
            fields_v1_of(obj, lt),
            to_fields_v1(&fields_of(obj, lt)),
            "{obj}"
        );
    }
    let schema = json!({"properties": {"spec": {"properties": {
        "ports": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "proto"],
                  "items": {"properties": {"port": {}, "proto": {}, "name": {},
                    "hosts": {"x-kubernetes-list-type": "set"}}}},
        "tags": {"x-kubernetes-list-type": "set"},
        "steps": {}}}}});
    let lt = ListTypes::from_schema(Some(&schema));
    let custom = json!({"spec": {"ports": [{"port": 1, "proto": "TCP", "name": "a", "hosts": ["h"]},
                                           {"port": 1, "proto": "UDP"}],
                                 "tags": ["x", 1, {"k": "v"}], "steps": ["one", "two"]}});
    assert_eq!(
        fields_v1_of(&custom, lt),
        to_fields_v1(&fields_of(&custom, lt))
    );
    // What a create records, spelled out (structured-merge-diff's encoding).
    assert_eq!(
        fields_v1_of(&config_map, ListTypes::builtin()),
        json!({"f:data": {"f:e": {}, "f:k": {}}})
    );
    assert_eq!(
        fields_v1_of(&custom, lt)["f:spec"]["f:ports"]["k:{\"port\":1,\"proto\":\"TCP\"}"],
        json!({".": {}, "f:hosts": {"v:\"h\"": {}}, "f:name": {}, "f:port": {}, "f:proto": {}})
    );
}

fn writer(m: &str) -> Writer<'_> {
    Writer {
        manager: m,
        api_version: "v1",
        subresource: "",
        time: "2024-01-01T00:00:00Z",
    }
}

#[test]
fn two_managers_keep_their_fields_and_conflict_on_shared_ones() {
    let a = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": "1"}}, "data": {"x": "1"}});
    let obj = apply(None, &a, &writer("alice"), false, ListTypes::builtin()).expect("first apply");
    let b = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"b": "2"}}, "data": {"y": "2"}});
    let obj =
        apply(Some(&obj), &b, &writer("bob"), false, ListTypes::builtin()).expect("disjoint apply");
    assert_eq!(obj["data"], json!({"x": "1", "y": "2"}));
    assert_eq!(obj["metadata"]["labels"], json!({"a": "1", "b": "2"}));
    // Alice drops her label: it goes; Bob's stays.
    let a2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"x": "1"}});
    let obj = apply(
        Some(&obj),
        &a2,
        &writer("alice"),
        false,
        ListTypes::builtin(),
    )
    .expect("re-apply");
    assert_eq!(obj["metadata"]["labels"], json!({"b": "2"}));
    // Bob setting Alice's field to another value conflicts unless forced.
    let b2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"x": "9", "y": "2"}});
    let err =
        apply(Some(&obj), &b2, &writer("bob"), false, ListTypes::builtin()).expect_err("conflict");
    assert_eq!(
        err.message(),
        "Apply failed with 1 conflict: conflict with \"alice\" using v1: .data.x"
    );
    let forced =
        apply(Some(&obj), &b2, &writer("bob"), true, ListTypes::builtin()).expect("forced");
    assert_eq!(forced["data"]["x"], "9");
    let owners = read_managed(&forced);
    let alice = owners.iter().find(|e| e.manager == "alice");
    assert!(alice.is_none_or(|e| {
        !e.fields
            .contains(&vec![Seg::Field("data".into()), Seg::Field("x".into())])
    }));
}

#[test]
fn the_same_value_applied_by_two_managers_is_shared_not_a_conflict() {
    let live_defaulted = |mut obj: Value| {
        // What defaulting adds to a container after the first apply.
        obj["spec"]["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
        obj
    };
    let manifest = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                          "spec": {"containers": [{"name": "c", "image": "nginx:1.25"}]}});
    let obj = apply(
        None,
        &manifest,
        &writer("alice"),
        false,
        ListTypes::builtin(),
    )
    .expect("first apply");
    let obj = live_defaulted(obj);
    let obj = apply(
        Some(&obj),
        &manifest,
        &writer("bob"),
        false,
        ListTypes::builtin(),
    )
    .expect("the same values are shared");
    let image = vec![
        Seg::Field("spec".into()),
        Seg::Field("containers".into()),
        Seg::Key(r#"{"name":"c"}"#.into()),
        Seg::Field("image".into()),
    ];
    let owners: Vec<String> = read_managed(&obj)
        .into_iter()
        .filter(|e| e.fields.contains(&image))
        .map(|e| e.manager)
        .collect();
    assert_eq!(owners, ["alice", "bob"]);
    let mut changed = manifest.clone();
    changed["spec"]["containers"][0]["image"] = json!("nginx:1.26");
    let err = apply(
        Some(&obj),
        &changed,
        &writer("carol"),
        false,
        ListTypes::builtin(),
    )
    .expect_err("a different value conflicts with both owners");
    assert_eq!(
        err.message(),
        "Apply failed with 2 conflicts: conflict with \"alice\" using v1: .spec.containers[name=\"c\"].image\n conflict with \"bob\" using v1: .spec.containers[name=\"c\"].image"
    );
}

#[test]
fn keyed_lists_are_owned_per_item_and_round_trip_fields_v1() {
    let a = json!({"spec": {"containers": [{"name": "a", "image": "1"}]}});
    let set = fields_of(&a, ListTypes::builtin());
    let v1 = to_fields_v1(&set);
    assert_eq!(
        v1,
        json!({"f:spec": {"f:containers": {"k:{\"name\":\"a\"}": {".": {}, "f:image": {}, "f:name": {}}}}})
    );
    assert_eq!(from_fields_v1(&v1), set);
    let obj = apply(None, &a, &writer("a"), false, ListTypes::builtin()).expect("apply");
    let b = json!({"spec": {"containers": [{"name": "b", "image": "2"}]}});
    let obj = apply(Some(&obj), &b, &writer("b"), false, ListTypes::builtin()).expect("apply");
    assert_eq!(obj["spec"]["containers"].as_array().map(Vec::len), Some(2));
}

#[test]
fn updates_take_ownership_of_changed_fields() {
    let old = apply(
        None,
        &json!({"data": {"x": "1"}}),
        &writer("alice"),
        false,
        ListTypes::builtin(),
    )
    .expect("apply");
    let mut new = old.clone();
    new["data"]["x"] = json!("2");
    track_update(
        Some(&old),
        &mut new,
        &writer("editor"),
        ListTypes::builtin(),
    );
    let entries = read_managed(&new);
    assert_eq!(entries.len(), 1, "{new}");
    assert_eq!(entries[0].manager, "editor");
}

#[test]
fn custom_resources_follow_their_schema_list_types() {
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "routes": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["dest", "port"],
                   "items": {"type": "object", "properties": {"dest": {"type": "string"}, "port": {"type": "integer"}, "via": {"type": "string"}}}},
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "conditions": {"type": "array", "items": {"type": "object"}}}}}});
    let lt = ListTypes::from_schema(Some(&schema));
    let a = json!({"spec": {"routes": [{"dest": "x", "port": 1, "via": "a"}], "tags": ["t1"], "conditions": [{"type": "A"}]}});
    let obj = apply(None, &a, &writer("alice"), false, lt).expect("apply");
    let b = json!({"spec": {"routes": [{"dest": "x", "port": 2, "via": "b"}], "tags": ["t2"]}});
    let obj = apply(Some(&obj), &b, &writer("bob"), false, lt).expect("disjoint keys");
    assert_eq!(
        obj["spec"]["routes"].as_array().map(Vec::len),
        Some(2),
        "{obj}"
    );
    assert_eq!(obj["spec"]["tags"], json!(["t2", "t1"]));
    let fields = fields_of(&a, lt);
    assert!(fields.contains(&vec![
        Seg::Field("spec".into()),
        Seg::Field("routes".into()),
        Seg::Key(r#"{"dest":"x","port":1}"#.into())
    ]));
    // Without a list type, a custom resource's list is atomic (unlike built-in conditions).
    assert!(fields.contains(&vec![
        Seg::Field("spec".into()),
        Seg::Field("conditions".into())
    ]));
}

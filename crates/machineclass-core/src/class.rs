//! The MachineClass reconcile decision (MCM's `reconcileClusterMachineClass`).

use capstan_apis::machine::{FINALIZER_MCM, Machine, MachineClass};

use crate::meta::{has_finalizer, is_deleting};

/// Reason recorded (Warning Event, error) while a deleting class is still in use.
pub const STILL_REFERRED: &str = "machines still refer to this machine class";

/// The name of the MachineClass a Machine uses (`spec.class.kind == "MachineClass"` only).
pub fn class_name_of(machine: &Machine) -> Option<&str> {
    machine.spec.class.as_ref()?.machine_class_name()
}

/// True when `machine` uses the class `namespace/name`.
pub fn machine_uses_class(machine: &Machine, namespace: &str, name: &str) -> bool {
    machine.metadata.namespace.as_deref().unwrap_or_default() == namespace
        && class_name_of(machine) == Some(name)
}

/// What to do with a MachineClass, given how many Machines use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassAction {
    /// Used and live: add the finalizer when missing, enqueue its machines, requeue after the long period.
    InUse {
        /// The finalizer is missing and must be added.
        add_finalizer: bool,
    },
    /// Being deleted while machines still use it: keep the finalizer, Warning Event, retry short.
    DeletionBlocked {
        /// How many machines refer to the class.
        machines: usize,
    },
    /// No machine uses it: remove the finalizer when present (a deleting class then goes away).
    Unused {
        /// The finalizer is present and must be removed.
        remove_finalizer: bool,
    },
}

impl ClassAction {
    /// True when applying the action writes to the class.
    pub fn writes(&self) -> bool {
        matches!(
            self,
            ClassAction::InUse {
                add_finalizer: true
            } | ClassAction::Unused {
                remove_finalizer: true
            }
        )
    }

    /// The message of a blocked deletion.
    pub fn blocked_message(machines: usize) -> String {
        format!("{STILL_REFERRED} ({machines} machine(s))")
    }
}

/// Decides the MachineClass reconcile from the class and the number of Machines using it.
pub fn decide_class(class: &MachineClass, machines_using: usize) -> ClassAction {
    let finalized = has_finalizer(&class.metadata, FINALIZER_MCM);
    match (is_deleting(&class.metadata), machines_using) {
        (_, 0) => ClassAction::Unused {
            remove_finalizer: finalized,
        },
        (false, _) => ClassAction::InUse {
            add_finalizer: !finalized,
        },
        (true, n) => ClassAction::DeletionBlocked { machines: n },
    }
}

/// Whether a shard's count of the Machines using `class` (`local_users`, from its own share of
/// the Machines) is enough to decide the class, or the decision needs every Machine (a fresh
/// LIST). Sharded, no replica caches every Machine; a positive local count is a lower bound, so
/// it settles a live class alone: [`decide_class`] says `InUse` for any positive count, and
/// `add_finalizer` does not depend on the count. A local zero may hide users on other shards
/// (`Unused` must not be decided from it), and a deleting class announces the exact count.
pub fn needs_every_machine(class: &MachineClass, local_users: usize) -> bool {
    local_users == 0 || is_deleting(&class.metadata)
}

/// How many of `machines` use the class `namespace/name` (a page of a LIST, or a whole one).
pub fn users_among<'a>(
    machines: impl IntoIterator<Item = &'a Machine>,
    namespace: &str,
    name: &str,
) -> usize {
    machines
        .into_iter()
        .filter(|m| machine_uses_class(m, namespace, name))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timestamp;
    use capstan_apis::machine::{ClassSpec, MachineClassSpec, MachineSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn class(finalizer: bool, deleting: bool) -> MachineClass {
        let mut c = MachineClass::new(
            "test-mc",
            MachineClassSpec {
                provider_spec: serde_json::json!({}),
                provider: None,
                secret_ref: None,
                credentials_secret_ref: None,
                node_template: None,
            },
        );
        c.metadata.namespace = Some("default".into());
        if finalizer {
            c.metadata.finalizers = Some(vec![FINALIZER_MCM.into()]);
        }
        if deleting {
            c.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        }
        c
    }

    fn machine(class: &str) -> Machine {
        Machine {
            metadata: ObjectMeta {
                name: Some(format!("m-{class}")),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            spec: MachineSpec {
                class: Some(ClassSpec {
                    api_group: None,
                    kind: Some("MachineClass".into()),
                    name: Some(class.into()),
                }),
                ..MachineSpec::default()
            },
            status: None,
        }
    }

    fn users(class: &MachineClass, machines: &[Machine]) -> usize {
        let ns = class.metadata.namespace.as_deref().unwrap_or_default();
        let name = class.metadata.name.as_deref().unwrap_or_default();
        machines
            .iter()
            .filter(|m| machine_uses_class(m, ns, name))
            .count()
    }

    /// The spec's acceptance table for class `test-mc`, row by row.
    #[test]
    fn acceptance_table() {
        let uses = vec![machine("test-mc")];
        let other = vec![machine("other-mc")];
        let rows: [(MachineClass, &[Machine], ClassAction); 6] = [
            (
                class(false, false),
                &uses,
                ClassAction::InUse {
                    add_finalizer: true,
                },
            ),
            (
                class(false, false),
                &[],
                ClassAction::Unused {
                    remove_finalizer: false,
                },
            ),
            (
                class(true, false),
                &uses,
                ClassAction::InUse {
                    add_finalizer: false,
                },
            ),
            (
                class(true, true),
                &uses,
                ClassAction::DeletionBlocked { machines: 1 },
            ),
            (
                class(true, true),
                &other,
                ClassAction::Unused {
                    remove_finalizer: true,
                },
            ),
            (
                class(false, true),
                &other,
                ClassAction::Unused {
                    remove_finalizer: false,
                },
            ),
        ];
        for (i, (class, machines, expected)) in rows.into_iter().enumerate() {
            let action = decide_class(&class, users(&class, machines));
            assert_eq!(action, expected, "row {}", i + 1);
        }
        // Only rows 1 and 5 write.
        assert!(
            ClassAction::InUse {
                add_finalizer: true
            }
            .writes()
        );
        assert!(
            ClassAction::Unused {
                remove_finalizer: true
            }
            .writes()
        );
        assert!(!ClassAction::DeletionBlocked { machines: 1 }.writes());
        assert!(ClassAction::blocked_message(1).contains("still refer"));
    }

    #[test]
    fn a_local_user_settles_a_live_class_and_anything_else_needs_every_machine() {
        // Live class: one local user decides it, with or without the finalizer.
        for finalized in [true, false] {
            let live = class(finalized, false);
            assert!(!needs_every_machine(&live, 1), "finalized {finalized}");
            // The decision from the local lower bound is the one from any larger total.
            assert_eq!(decide_class(&live, 1), decide_class(&live, 600));
            // A local zero may hide users on other shards.
            assert!(needs_every_machine(&live, 0), "finalized {finalized}");
            assert_ne!(decide_class(&live, 0), decide_class(&live, 1));
        }
        // Deleting: the Warning names the exact count, so every Machine is counted.
        let deleting = class(true, true);
        assert!(needs_every_machine(&deleting, 3));
        assert!(needs_every_machine(&deleting, 0));
    }

    #[test]
    fn users_among_counts_this_class_only() {
        let machines = [machine("test-mc"), machine("other-mc"), machine("test-mc")];
        assert_eq!(users_among(&machines, "default", "test-mc"), 2);
        assert_eq!(users_among(&machines, "other-ns", "test-mc"), 0);
        assert_eq!(users_among(&machines, "default", "absent"), 0);
    }

    #[test]
    fn only_machine_class_kind_and_same_namespace_count() {
        let mut m = machine("test-mc");
        assert!(machine_uses_class(&m, "default", "test-mc"));
        assert!(!machine_uses_class(&m, "other-ns", "test-mc"));
        m.spec.class.as_mut().expect("class set").kind = Some("AWSMachineClass".into());
        assert!(!machine_uses_class(&m, "default", "test-mc"));
        assert_eq!(class_name_of(&m), None);
    }
}

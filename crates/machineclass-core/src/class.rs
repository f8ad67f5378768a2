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
    fn only_machine_class_kind_and_same_namespace_count() {
        let mut m = machine("test-mc");
        assert!(machine_uses_class(&m, "default", "test-mc"));
        assert!(!machine_uses_class(&m, "other-ns", "test-mc"));
        m.spec.class.as_mut().expect("class set").kind = Some("AWSMachineClass".into());
        assert!(!machine_uses_class(&m, "default", "test-mc"));
        assert_eq!(class_name_of(&m), None);
    }
}

//! MCM's safety controller, provider half (`machine_safety.go` of the provider machine
//! controller): VMs the driver lists that no Machine accounts for are orphans, and deleted.

use std::collections::BTreeMap;

use capstan_apis::machine::{Machine, MachinePhase};

/// What is known of the Machine named like a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineRecord {
    /// No Machine of that name.
    Missing,
    /// A Machine of that name, with the provider ID it recorded (if any yet), and whether it is
    /// still being created (phase empty or `CrashLoopBackOff`).
    Present {
        provider_id: Option<String>,
        creating: bool,
    },
}

impl MachineRecord {
    /// What the sweep reads of an existing `machine`: its recorded provider ID, and whether it is
    /// still being created (phase empty or `CrashLoopBackOff`).
    pub fn of(machine: &Machine) -> Self {
        Self::Present {
            provider_id: machine.spec.provider_id.clone(),
            creating: matches!(machine.phase(), None | Some(MachinePhase::CrashLoopBackOff)),
        }
    }
}

/// One orphan VM: its provider ID and the machine name the driver reported for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub provider_id: String,
    pub machine_name: String,
}

/// The orphans among `vms` (provider ID -> machine name, as `ListMachines` answers): a VM whose
/// Machine does not exist, or whose Machine records another provider ID (the VM of an earlier
/// incarnation of that name), unless that Machine is still being created (MCM skips phase `""`
/// and `CrashLoopBackOff`).
///
/// **Decision:** a Machine that has not recorded a provider ID yet is creating its VM right now
/// (the driver answered, the status write is in flight), so its VM is not an orphan whatever its
/// phase.
pub fn orphans(
    vms: &BTreeMap<String, String>,
    machine: impl Fn(&str) -> MachineRecord,
) -> Vec<Orphan> {
    vms.iter()
        .filter(|(provider_id, name)| match machine(name) {
            MachineRecord::Missing => true,
            MachineRecord::Present { creating: true, .. } => false,
            MachineRecord::Present {
                provider_id: Some(recorded),
                ..
            } => !recorded.is_empty() && recorded != **provider_id,
            MachineRecord::Present {
                provider_id: None, ..
            } => false,
        })
        .map(|(provider_id, name)| Orphan {
            provider_id: provider_id.clone(),
            machine_name: name.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn present(provider_id: &str, creating: bool) -> MachineRecord {
        MachineRecord::Present {
            provider_id: Some(provider_id.into()),
            creating,
        }
    }

    /// docs/machineset.md SAFE-7.
    #[test]
    fn safe_7_vms_without_their_machine_are_orphans() {
        let vms = BTreeMap::from([
            ("aws:///i-1".to_owned(), "m1".to_owned()),
            ("aws:///i-9".to_owned(), "m9".to_owned()),
        ]);
        let names = |found: Vec<Orphan>| -> Vec<String> {
            found.into_iter().map(|o| o.provider_id).collect()
        };
        let running = |name: &str| match name {
            "m1" => present("aws:///i-2", false),
            _ => MachineRecord::Missing,
        };
        assert_eq!(names(orphans(&vms, running)), ["aws:///i-1", "aws:///i-9"]);
        let creating = |name: &str| match name {
            "m1" => present("aws:///i-2", true),
            _ => MachineRecord::Missing,
        };
        assert_eq!(names(orphans(&vms, creating)), ["aws:///i-9"]);
    }

    #[test]
    fn a_machine_without_a_provider_id_yet_keeps_its_vm() {
        let vms = BTreeMap::from([("sim:///ns/m".to_owned(), "m".to_owned())]);
        let record = |_: &str| MachineRecord::Present {
            provider_id: None,
            creating: false,
        };
        assert!(orphans(&vms, record).is_empty());
        let same = |_: &str| present("sim:///ns/m", false);
        assert!(orphans(&vms, same).is_empty());
    }

    #[test]
    fn a_machine_record_is_creating_until_it_has_a_phase_past_crash_loop() {
        let machine = |phase: Option<&str>| -> Machine {
            let mut value = serde_json::json!({
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
                "metadata": {"name": "m", "namespace": "default"},
                "spec": {"providerID": "sim:///default/m"}
            });
            if let Some(phase) = phase {
                value["status"] = serde_json::json!({"currentStatus": {"phase": phase}});
            }
            serde_json::from_value(value).expect("a valid Machine")
        };
        for (phase, creating) in [
            (None, true),
            (Some("CrashLoopBackOff"), true),
            (Some("Pending"), false),
            (Some("Running"), false),
        ] {
            assert_eq!(
                MachineRecord::of(&machine(phase)),
                present("sim:///default/m", creating),
                "{phase:?}"
            );
        }
    }
}

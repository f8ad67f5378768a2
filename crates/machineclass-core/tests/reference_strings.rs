//! MCM's status texts (`shared/spec/machineclass.md`), pinned as literals. The deletion markers
//! are where a restarted controller (ours or MCM's) reads its position from, so they are wire
//! format, not wording.

use machineclass_core::{class, deletion};

#[test]
fn the_class_in_use_reason_is_mcms() {
    assert_eq!(
        class::STILL_REFERRED,
        "machines still refer to this machine class"
    );
}

#[test]
fn deletion_step_markers_are_mcms() {
    assert_eq!(
        deletion::GET_VM_STATUS,
        "Set machine status to termination. Now, getting VM Status"
    );
    assert_eq!(deletion::INITIATE_DRAIN, "Initiate node drain");
    assert_eq!(
        deletion::DELETE_VOLUME_ATTACHMENTS,
        "Delete Volume Attachments"
    );
    assert_eq!(deletion::INITIATE_VM_DELETION, "Initiate VM deletion");
    assert_eq!(deletion::INITIATE_NODE_DELETION, "Initiate node deletion");
    assert_eq!(
        deletion::INITIATE_FINALIZER_REMOVAL,
        "Initiate machine object finalizer removal"
    );
}

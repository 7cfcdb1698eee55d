//! virt-handler: the per-node agent that drives virt-launchers (skeleton).

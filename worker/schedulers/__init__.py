"""Launch a plan through a cluster's own scheduler instead of through workers: Slurm (a batch
script) and Kubernetes (a Kubeflow PyTorchJob). Both start one task per node running
`python -m worker.batch node` (torchrun's multi-node agent, c10d rendezvous on the first node)."""

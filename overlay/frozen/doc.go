// Package frozen owns overlay's frozen layers (docs/STORAGE.md, "Frozen
// layers"): committed checkpoints' writable layers kept read-only on this
// host, so that a branch stacks on one instead of copying it. Layers is
// the layers on disk (build, publish, remove, verify; layers.go, build.go,
// patch.go); Keeper is their policy (which to keep, the background freezes
// and when they run, the layer a branch needs now; keep.go, jobs.go,
// idle.go, branch.go). Package overlay stacks roots on the layers and
// offers the policy to the engine as rootfs.Freezer; what the policy needs
// of the engine (the catalog's lines, the store, locks, room) comes in
// Deps.
package frozen

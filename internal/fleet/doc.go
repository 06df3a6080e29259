// Package fleet holds the fleet test (fleet_test.go): three hosts, each a
// network namespace with its own home, home id and `turnsnap serve`, share
// one MinIO bucket under a randomised workload with daemons and MinIO
// SIGKILLed at random moments; a fourth, fresh host then checks from the
// bucket alone that nothing reported remote-durable was lost, that every
// head resolves, that no sandbox ever had two accepted writers and that no
// lock outlived its window (docs/STORAGE.md, "The fleet test").
//
// The package has no code outside its tests; its hosts and their network
// are package internal/fleethost's.
package fleet

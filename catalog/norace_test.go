//go:build !race

package catalog

// raceEnabled: the race detector is on (see TestKilledInsideBadger).
const raceEnabled = false

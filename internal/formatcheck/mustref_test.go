package formatcheck

import "github.com/turnsnap/turnsnap/catalog"

// mustRef parses a checkpoint reference a test wrote (or made of an ID it
// holds); "" is the zero reference (a diff's head or live root, verify's
// every record). It panics on one that does not parse: a test's mistake.
func mustRef(s string) catalog.CheckpointRef {
	if s == "" {
		return catalog.CheckpointRef{}
	}
	r, err := catalog.ParseCheckpointRef(s)
	if err != nil {
		panic(err)
	}
	return r
}

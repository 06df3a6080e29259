package catalog

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// badgerLogger sends Badger's log lines to slog. Badger logs every table open,
// replay and compaction at Info, which is noise on every CLI command; only its
// warnings and errors say something the user should see, so Info and Debug are
// dropped here rather than merely filtered by the handler level.
type badgerLogger struct {
	log *slog.Logger
}

func newBadgerLogger(l *slog.Logger, dir string) *badgerLogger {
	return &badgerLogger{log: l.With("component", "badger", "catalog", dir)}
}

func (b *badgerLogger) Errorf(format string, args ...any) {
	// A failed Open logs its error before returning the same error, which
	// Open either recovers from (a killed writer's logs) or reports itself:
	// the line would only put an opaque ERROR before a command that works.
	if strings.HasPrefix(format, "Received err: ") {
		return
	}
	b.emit(slog.LevelError, format, args)
}

func (b *badgerLogger) Warningf(format string, args ...any) { b.emit(slog.LevelWarn, format, args) }

func (b *badgerLogger) Infof(string, ...any) {}

func (b *badgerLogger) Debugf(string, ...any) {}

func (b *badgerLogger) emit(level slog.Level, format string, args []any) {
	ctx := context.Background()
	if !b.log.Enabled(ctx, level) {
		return
	}
	// Badger's format strings carry their own trailing newline.
	b.log.Log(ctx, level, strings.TrimSpace(fmt.Sprintf(format, args...)))
}

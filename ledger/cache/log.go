package cache

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logThrottle logs Redis trouble as warnings at most once per interval and
// as debug messages in between: while Redis is down every request would
// otherwise log.
type logThrottle struct {
	log      *zap.Logger
	interval time.Duration

	mu   sync.Mutex
	last time.Time
}

func (t *logThrottle) warn(msg string, fields ...zap.Field) {
	now := time.Now()
	t.mu.Lock()
	level := zapcore.DebugLevel
	if now.Sub(t.last) >= t.interval {
		t.last = now
		level = zapcore.WarnLevel
	}
	t.mu.Unlock()
	if ce := t.log.Check(level, msg); ce != nil {
		ce.Write(fields...)
	}
}

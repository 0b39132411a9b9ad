//go:build integration

package postgres

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

// dsn returns the test server's address; under the integration tag a
// missing address is a failure, never a skip.
func dsn(t *testing.T) string {
	t.Helper()
	d := os.Getenv("ONEJOB_TEST_POSTGRES")
	if d == "" {
		t.Fatal("ONEJOB_TEST_POSTGRES is not set: run ./integration/test.sh, which starts PostgreSQL")
	}
	return d
}

var schemaSeq struct {
	sync.Mutex
	n int
}

// newSchema returns a schema name no other test uses, dropped at cleanup.
func newSchema(t *testing.T) string {
	schemaSeq.Lock()
	schemaSeq.n++
	name := fmt.Sprintf("onejob_t%d_%d", os.Getpid(), schemaSeq.n)
	schemaSeq.Unlock()
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), dsn(t))
		if err != nil {
			t.Errorf("drop schema: %v", err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	return name
}

func open(t *testing.T, schema string) *Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := Open(ctx, dsn(t), Options{Schema: schema})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestConformance(t *testing.T) {
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger { return open(t, newSchema(t)) },
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			return open(t, l.(*Ledger).Schema())
		},
	})
}

package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The statements a completion sends, prepared by name on each connection.
const (
	completeSQL = `SELECT * FROM complete($1, $2, $3, $4, $5, $6, $7, $8)`
	announceSQL = `SELECT announce($1)`
)

// completeAnnouncing runs complete with args, scanning its row into dest,
// and then announce for the job, in one round trip: a pipeline with a Sync
// after each statement, so each is a transaction of its own. The server
// runs them in order, so announce starts once complete's commit is
// durable, and its notification is outside complete's transaction
// (functions.sql says why it must be). announce's own result is not
// waited for by anyone: if it fails, waiters see the result at their next
// read. It is sent whether complete won or not (the pipeline cannot wait
// for the answer): a loser's announcement costs its waiters, if any, one
// read.
func (l *Ledger) completeAnnouncing(ctx context.Context, jobID string, args, dest []any) (err error) {
	c, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	conn := c.Conn()
	complete, err := conn.Prepare(ctx, "onejob_complete", completeSQL)
	if err != nil {
		return err
	}
	announce, err := conn.Prepare(ctx, "onejob_announce", announceSQL)
	if err != nil {
		return err
	}
	var cq, aq pgx.ExtendedQueryBuilder
	if err := cq.Build(conn.TypeMap(), complete, args); err != nil {
		return err
	}
	if err := aq.Build(conn.TypeMap(), announce, []any{jobID}); err != nil {
		return err
	}
	if t, ok := conn.Config().Tracer.(pgx.BatchTracer); ok {
		b := &pgx.Batch{}
		b.Queue(completeSQL, args...)
		b.Queue(announceSQL, jobID)
		ctx = t.TraceBatchStart(ctx, conn, pgx.TraceBatchStartData{Batch: b})
		defer func() {
			t.TraceBatchQuery(ctx, conn, pgx.TraceBatchQueryData{SQL: completeSQL, Args: args, Err: err})
			t.TraceBatchQuery(ctx, conn, pgx.TraceBatchQueryData{SQL: announceSQL, Args: []any{jobID}})
			t.TraceBatchEnd(ctx, conn, pgx.TraceBatchEndData{Err: err})
		}()
	}

	p := conn.PgConn().StartPipeline(ctx)
	p.SendQueryStatement(complete, cq.ParamValues, cq.ParamFormats, cq.ResultFormats)
	p.SendPipelineSync()
	p.SendQueryStatement(announce, aq.ParamValues, aq.ParamFormats, aq.ResultFormats)
	if err := p.Sync(); err != nil {
		return err
	}
	err = scanOne(conn, p, dest)
	if err == nil {
		// complete's row comes before its commit: the transaction
		// commits at the Sync, and only the answer to the Sync says the
		// commit is durable (or why it failed).
		err = synced(p)
	}
	// Close reads what is left: announce's result and its Sync (or, after
	// an error, all of it). What goes wrong in announce is not
	// complete's error, and a connection that broke is closed, which the
	// pool sees.
	_ = p.Close()
	return err
}

// synced reads the pipeline's next result, which must be a Sync's.
func synced(p *pgconn.Pipeline) error {
	res, err := p.GetResults()
	if err != nil {
		return err
	}
	if _, ok := res.(*pgconn.PipelineSync); !ok {
		return fmt.Errorf("pipeline: a %T where a Sync's answer was expected", res)
	}
	return nil
}

// scanOne reads the pipeline's next result, a statement's single row,
// into dest.
func scanOne(conn *pgx.Conn, p *pgconn.Pipeline, dest []any) error {
	res, err := p.GetResults()
	if err != nil {
		return err
	}
	rr, ok := res.(*pgconn.ResultReader)
	if !ok {
		return fmt.Errorf("pipeline: a %T where a statement's rows were expected", res)
	}
	rows := pgx.RowsFromResultReader(conn.TypeMap(), rr)
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

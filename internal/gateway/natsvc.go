package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/natsauth"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
)

// StatusHeader carries the HTTP status of a NATS answer (201 new run, 200
// replay or batch, 4xx/5xx error), so NATS callers can tell a new run from
// a replay as HTTP callers do. The body holds the same number for errors.
const StatusHeader = "Harvest-Status"

// ServeNATS subscribes the start service: <prefix>.start.* and
// <prefix>.start_batch.* in the gateways' queue group, so each request
// reaches one gateway. Requests are handled concurrently (up to
// HARVEST_GATEWAY_NATS_INFLIGHT), which is what lets concurrent starts
// share commits. Close unsubscribes and waits for requests in progress.
func (g *Gateway) ServeNATS() error {
	if g.nc == nil {
		return fmt.Errorf("gateway: no NATS connection")
	}
	g.natsMu.Lock()
	defer g.natsMu.Unlock()
	for _, s := range []struct {
		subject string
		batch   bool
	}{{g.subjects.StartAll(), false}, {g.subjects.StartBatchAll(), true}} {
		batch := s.batch
		sub, err := g.nc.QueueSubscribe(s.subject, g.cfg.QueueGroup, func(msg *nats.Msg) {
			select {
			case g.inflight <- struct{}{}:
			default:
				// Every handler is busy with starts waiting on their
				// shards: the request is shed now rather than left in the
				// client library's buffer, where its caller would wait
				// for an answer behind all of them (shed.go).
				g.natsBusy(msg, batch)
				return
			}
			g.handlers.Go(func() {
				defer func() { <-g.inflight }()
				g.natsStart(msg, batch)
			})
		})
		if err != nil {
			for _, s := range g.subs {
				_ = s.Unsubscribe()
			}
			g.subs = nil
			return fmt.Errorf("gateway: subscribe %s: %w", s.subject, err)
		}
		// The client library's buffer holds what arrives while the
		// callback answers; let it hold a burst.
		_ = sub.SetPendingLimits(64*1024, 256*1024*1024)
		g.subs = append(g.subs, sub)
	}
	// Make sure the server has the subscriptions before callers are told
	// the gateway is up.
	return g.nc.Flush()
}

// natsStart answers one start or batch-start request.
func (g *Gateway) natsStart(msg *nats.Msg, batch bool) {
	// A request with a reply subject is a call the caller waits on (a
	// server span); one without is a message handled on its own (a
	// consumer span). Either way the start spans hang below it.
	kindOf := trace.SpanKindConsumer
	if msg.Reply != "" {
		kindOf = trace.SpanKindServer
	}
	ctx, span := g.tracer.Start(dispatch.Extract(context.Background(), msg),
		dispatch.SpanName(msg.Subject, dispatch.OperationProcess),
		trace.WithSpanKind(kindOf))
	defer span.End()
	// Without an exporter the span only carries ids onward: its
	// attributes would be built for every start and thrown away.
	recording := span.IsRecording()
	if recording {
		span.SetAttributes(dispatch.MessagingAttributes(msg.Subject, dispatch.OperationProcess)...)
		span.SetAttributes(
			semconv.MessagingConsumerGroupName(g.cfg.QueueGroup),
			semconv.MessagingMessageBodySize(len(msg.Data)))
	}
	kind := ".start."
	if batch {
		kind = ".start_batch."
	}
	tenant := strings.TrimPrefix(msg.Subject, g.cfg.SubjectPrefix+kind)
	reply := func(status int, v any) {
		if recording {
			span.SetAttributes(attribute.Int("harvest.status", status))
		}
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
		if msg.Reply == "" {
			return
		}
		out := nats.NewMsg(msg.Reply)
		out.Header.Set(StatusHeader, strconv.Itoa(status))
		b, err := json.Marshal(v)
		if err != nil {
			return
		}
		out.Data = b
		if err := g.nc.PublishMsg(out); err != nil {
			g.log.Warn("gateway: NATS reply", "err", err)
		}
	}
	fail := func(e *api.Error) {
		g.countRefused(ctx, TransportNATS, e)
		reply(e.Status, api.ErrorBody{Error: e})
	}
	if err := auth.ValidateTenant(tenant); err != nil {
		fail(api.NewError(api.CodeInvalidArgument, "subject %q does not name a tenant: %v", msg.Subject, err))
		return
	}
	if msg.Reply != "" && !natsauth.OwnInbox(tenant, msg.Reply) {
		// The gateway's NATS user may publish anywhere, so answering on a
		// subject the caller chose would let a tenant write into another
		// tenant's inbox or run events, or onto the workers' subjects. The
		// request is refused and answered to nobody; there is no setting
		// that turns this off.
		g.countRefused(ctx, TransportNATS, api.NewError(api.CodePermissionDenied, "reply subject outside the tenant's inbox"))
		g.log.Warn("gateway: NATS start with a reply subject outside the tenant's inbox refused", "tenant", tenant)
		return
	}
	if int64(len(msg.Data)) > g.cfg.MaxBodyBytes {
		fail(tooLarge(g.cfg.MaxBodyBytes))
		return
	}
	c := caller{transport: TransportNATS, tenant: tenant}
	if batch {
		reqs, errs, e := decodeBatch(msg.Data)
		if e != nil {
			fail(e)
			return
		}
		release, e := g.admitStarts(ctx, c, batchWeight(errs, len(reqs)))
		if e != nil {
			reply(e.Status, api.ErrorBody{Error: e})
			return
		}
		res := g.startMany(ctx, c, reqs, errs)
		release()
		status, body := batchResponse(res)
		if eb, ok := body.(api.ErrorBody); ok {
			body = api.ErrorBody{Error: g.withRetryAfter(eb.Error)}
		}
		reply(status, body)
		return
	}
	req, e := decodeStart(msg.Data)
	if e != nil {
		fail(e)
		return
	}
	// Shed before the start waits on its shard, as over HTTP (shed.go):
	// the same budget, with retry_after_ms in the answer.
	release, e := g.admitStarts(ctx, c, 1)
	if e != nil {
		reply(e.Status, api.ErrorBody{Error: e})
		return
	}
	res := g.startMany(ctx, c, []api.StartRequest{req}, nil)[0]
	release()
	switch {
	case res.err != nil:
		e := g.withRetryAfter(res.err)
		reply(e.Status, api.ErrorBody{Error: e})
	case res.created:
		reply(201, res.run)
	default:
		reply(200, res.run)
	}
}

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/engine"
	"github.com/turnsnap/turnsnap/internal/errdefs"
	"github.com/turnsnap/turnsnap/upload/sched"
)

func (a *app) initCmd() *cobra.Command {
	var rc api.RemoteConfig
	var bw, keyFile string
	var encryptLocal bool
	c := &cobra.Command{
		Use:   "init [--remote s3://BUCKET[/PREFIX] --endpoint HOST:PORT] [--key-file PATH]",
		Short: "Give this home a remote store (S3-compatible) and/or an encryption key",
		Long: `init checks that the bucket is reachable (creating it if needed), saves the
remote in HOME/config.json and queues every local object the bucket lacks.
Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the AWS
credentials file (of the process that opens the home: the daemon's, when one
serves it); they are never written to the config. Uploads then happen on
'turnsnap sync' and 'turnsnap checkpoint --wait-remote', and continuously in
the background while 'turnsnap serve' runs.

--key-file PATH (a file from 'turnsnap key generate') encrypts the store:
every object, local and remote, is sealed with XChaCha20-Poly1305 under a
data key that PATH's master key wraps (docs/FORMAT.md, docs/SECURITY.md),
and the local catalog is encrypted too. Content is then named by keyed
BLAKE3 (config.json "ids": "blake3-keyed"; the key derives from the data
key, so key rotation keeps every name): equal files deduplicate under one
key and get unrelated names under another. A new store gets a new data
key; a bucket that is already encrypted must be opened by its key, so a
second host runs the same init with the same key file, then 'catalog
rebuild'. Without the key, an encrypted store fails with exit code 9.

--encrypt-local=false (with --key-file, chosen once) keeps the local store
and catalog in plaintext: objects are sealed as they are uploaded and
opened, authenticated and verified as they are fetched, so the bucket
holds nothing readable while a stolen disk holds everything. Use it only
where the disk is as trusted as the host's memory.`,
		Args: cobra.NoArgs,
	}
	c.RunE = a.withService(nil, func(ctx context.Context, s service, _ []string) error {
		if rc.URL == "" && keyFile == "" {
			return fmt.Errorf("init: give --remote and --endpoint, --key-file, or both: %w", errdefs.ErrInvalid)
		}
		if (rc.URL == "") != (rc.Endpoint == "") {
			return fmt.Errorf("init: --remote and --endpoint go together: %w", errdefs.ErrInvalid)
		}
		if keyFile == "" && c.Flags().Changed("encrypt-local") {
			return fmt.Errorf("init: --encrypt-local goes with --key-file: %w", errdefs.ErrInvalid)
		}
		if bw != "" {
			n, err := parseBytes(bw)
			if err != nil {
				return err
			}
			rc.BandwidthBytes = n
		}
		req := api.InitRequest{KeyFile: keyFile}
		if keyFile != "" && !encryptLocal {
			req.EncryptLocal = &encryptLocal
		}
		if req.KeyFile != "" {
			abs, err := filepath.Abs(req.KeyFile)
			if err != nil {
				return err
			}
			req.KeyFile = abs
		}
		if rc.URL != "" {
			if rc.CAFile != "" {
				abs, err := filepath.Abs(rc.CAFile)
				if err != nil {
					return err
				}
				rc.CAFile = abs
			}
			req.Remote = &rc
		}
		r, err := s.Init(ctx, req)
		if err != nil {
			return err
		}
		if a.json {
			return printJSON(a.stdout(), r)
		}
		if id := r.KeyID; id != "" {
			where := "local and remote"
			if !r.EncryptLocal {
				where = "remote only; the local store is plaintext"
			}
			fmt.Fprintf(a.stdout(), "store encrypted with key %s (%s), content IDs %s\n", id, where, r.IDs)
		}
		if r.Remote != "" {
			fmt.Fprintf(a.stdout(), "remote %s ready; %d local objects (%s) queued for upload; run `turnsnap sync`\n",
				r.Remote, r.Queued, bytesStr(r.QueuedBytes))
		}
		return nil
	})
	f := c.Flags()
	f.StringVar(&rc.URL, "remote", "", "bucket and optional prefix, s3://BUCKET[/PREFIX]")
	f.StringVar(&rc.Endpoint, "endpoint", "", "S3 endpoint HOST:PORT")
	f.StringVar(&rc.Region, "region", "", "bucket region (default: ask the service)")
	f.BoolVar(&rc.Insecure, "insecure", false, "plain HTTP instead of TLS (loopback or trusted networks only)")
	f.StringVar(&rc.CAFile, "ca-file", "", "PEM bundle of extra CAs to trust")
	f.StringVar(&bw, "bwlimit", "", "upload bandwidth cap per host, e.g. 20MiB (default: none)")
	f.IntVar(&rc.Concurrency, "concurrency", 0, fmt.Sprintf("uploads in flight (default %d)", engine.DefaultUploadConcurrency))
	f.StringVar(&keyFile, "key-file", "", "master key file (turnsnap key generate) that encrypts the store")
	f.BoolVar(&encryptLocal, "encrypt-local", true, "encrypt the local store and catalog too (with --key-file; false: only the remote is sealed)")
	return c
}

func (a *app) syncCmd() *cobra.Command {
	var sandbox string
	c := &cobra.Command{
		Use:   "sync [--sandbox NAME]",
		Short: "Upload everything queued for the remote store (fairly across sandboxes)",
		Args:  cobra.NoArgs,
	}
	c.RunE = a.withService(nil, func(ctx context.Context, s service, _ []string) error {
		r, err := s.Sync(ctx, api.SyncRequest{Sandbox: sandbox})
		if err != nil {
			return err
		}
		if a.json {
			return printJSON(a.stdout(), r)
		}
		fmt.Fprintf(a.stdout(), "uploaded %d objects (%s), deleted %d, in %s\n", r.Uploaded, bytesStr(r.Bytes), r.Deleted,
			durStr(time.Duration(r.DurationMS)*time.Millisecond))
		return nil
	})
	c.Flags().StringVar(&sandbox, "sandbox", "", "only this sandbox's uploads (and what they depend on)")
	return c
}

func (a *app) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show what is still waiting for the remote store, per sandbox",
		Args:  cobra.NoArgs,
		RunE: a.withService(readOnly, func(ctx context.Context, s service, _ []string) error {
			r, err := s.Status(ctx)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(a.stdout(), r)
			}
			for _, s := range r.Sandboxes {
				if s.Interrupted != nil {
					fmt.Fprintf(a.stdout(), "sandbox %s: %s\n", s.Sandbox, s.Interrupted.Describe(s.Sandbox))
				}
			}
			if r.Remote == "" {
				fmt.Fprintln(a.stdout(), "no remote store: checkpoints are durable on this host only (see `turnsnap init`)")
				return nil
			}
			fmt.Fprintf(a.stdout(), "remote %s: %d objects (%s) pending\n", r.Remote, r.QueueDepth, bytesStr(r.PendingBytes))
			if lp := r.LastPush; lp != nil {
				outcome := "ok"
				if lp.Error != "" {
					outcome = "failed: " + lp.Error
				}
				fmt.Fprintf(a.stdout(), "last push %s (%s): %d objects, %s at %s/s, %s\n",
					lp.Finished.Local().Format("2006-01-02 15:04:05 MST"), humanize.Time(lp.Finished), lp.Uploaded, bytesStr(lp.Bytes),
					bytesStr(int64(lp.BytesPerSec)), outcome)
			}
			tw := tabwriter.NewWriter(a.stdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SANDBOX\tPENDING\tCHECKPOINTS\tUPLOADED")
			for _, s := range r.Sandboxes {
				fmt.Fprintf(tw, "%s\t%d objects, %s\t%d not remote yet\t%s\n", s.Sandbox, s.PendingObjects,
					bytesStr(s.PendingBytes), s.PendingCheckpoints, uploadedCell(s))
			}
			return tw.Flush()
		}),
	}
}

// uploadedCell is the UPLOADED column: a bar of the checkpoints that are
// remote, never full while anything the sandbox needs is still queued.
func uploadedCell(s api.SandboxStatus) string {
	done, total := int64(s.Checkpoints-s.PendingCheckpoints), int64(s.Checkpoints)
	if s.RemoteDurable {
		if total == 0 {
			return bar(1, 1) + " (its head, no checkpoint of its own)"
		}
		return bar(total, total)
	}
	if done >= total {
		// Every record of its own is up, but its head ref or description is
		// not, or its head is another sandbox's record still queued.
		done = max(total-1, 0)
	}
	cell := bar(done, max(total, 1))
	if len(s.WaitsFor) > 0 {
		cell += " (head waits for " + strings.Join(s.WaitsFor, ", ") + ")"
	} else if s.PendingObjects > 0 && s.PendingCheckpoints == 0 {
		cell += " (head ref not yet remote)"
	}
	return cell
}

// bar draws done/total as a 20-cell bar with a percentage.
func bar(done, total int64) string {
	if total <= 0 {
		return "-"
	}
	done = min(max(done, 0), total)
	n := int(20 * done / total)
	return fmt.Sprintf("[%s%s] %3d%%", strings.Repeat("#", n), strings.Repeat(".", 20-n), 100*done/total)
}

// uploads is PushOptions.Progress: bytes sent against bytes still pending.
func (pr *progress) uploads(st sched.Stats) {
	pr.update(engine.Progress{Blobs: st.Completed, Bytes: st.SentBytes, Elapsed: progressDelay,
		Phase: "upload", Total: st.SentBytes + st.PendingBytes, Done: st.SentBytes})
}

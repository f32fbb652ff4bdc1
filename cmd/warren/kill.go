package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenmq/warren/kill"
)

// sendFlags are the flags of kill and resume.
type sendFlags struct {
	force  bool
	wait   time.Duration
	asJSON bool
}

func (f *sendFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.force, "force", false, "send the command even if the queue does not exist (it is remembered for consumers that start later)")
	cmd.Flags().DurationVar(&f.wait, "wait", 5*time.Second, "how long to wait for the consumers' confirmations (0: do not ask for any)")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print the result as JSON")
}

// killer is a kill.Killer on the broker g names, signing with $WARREN_KILL_SECRET.
func (g *globals) killer(cmd *cobra.Command, f sendFlags) (*kill.Killer, error) {
	conn, err := g.connection()
	if err != nil {
		return nil, err
	}
	if f.wait < 0 {
		return nil, fmt.Errorf("--wait %s is negative", human(f.wait))
	}
	return kill.NewKiller(kill.Config{
		Connection:     conn,
		Secret:         []byte(os.Getenv("WARREN_KILL_SECRET")),
		PublishTimeout: g.timeout,
		Wait:           f.wait,
		Force:          f.force,
	}, logger(cmd))
}

// exitCodesHelp ends the Long help of kill and resume.
const exitCodesHelp = "\n\nIt waits until every consumer the broker counts has confirmed the command, at most --wait: each\n" +
	"consuming warren handler has a consumer on the queue, and each one, stopped or not, listens to\n" +
	"the kill topic. It prints how many confirmed, in how many processes, and how many were counted\n" +
	"(consumers of warren versions that do not count themselves as listeners are counted only while\n" +
	"they consume: for a resume of those, it waits for all of --wait). --json prints the result as JSON.\n\n" +
	"Exit codes:\n" +
	"  0  the command is in force: every consumer counted confirmed it (or, if none was counted, at\n" +
	"     least one did), or no consumer is listening (a warning: the command is remembered for\n" +
	"     consumers that start later), or --wait 0 (nothing asked)\n" +
	"  1  an error: nothing may have been sent\n" +
	"  2  the queue does not exist: nothing was declared or sent (--force sends it all the same)\n" +
	"  3  sent and remembered, but not confirmed by every consumer within --wait: some refused it\n" +
	"     (another $WARREN_KILL_SECRET?), are still finishing their messages, run an earlier warren\n" +
	"     version, or are not warren's"

func newKill(g *globals) *cobra.Command {
	var (
		del bool
		f   sendFlags
	)
	cmd := &cobra.Command{
		Use:   "kill QUEUE",
		Short: "Stop every consumer of QUEUE, in every process (remembered until resume)",
		Long: "Stop every consumer of QUEUE, in every process: each finishes and acks what it is processing,\n" +
			"returns what it prefetched to the queue, and stops. Consumers that start later do not consume\n" +
			"until `warren resume QUEUE`. With --delete the consumers drain the queue instead, and it is\n" +
			"deleted once empty, with its poison queue (if empty), kill exchange and kill state queue." +
			exitCodesHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			action := kill.Stop
			if del {
				action = kill.Delete
			}
			return send(cmd, g, f, args[0], action)
		},
	}
	cmd.Flags().BoolVar(&del, "delete", false, "drain the queue, then delete it")
	f.register(cmd)
	return cmd
}

func newResume(g *globals) *cobra.Command {
	var f sendFlags
	resume := &cobra.Command{
		Use:   "resume QUEUE",
		Short: "Lift a kill: the consumers of QUEUE take messages again",
		Long:  "Lift a kill: the consumers of QUEUE take messages again, and consumers that start later do too." + exitCodesHelp,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return send(cmd, g, f, args[0], kill.Resume)
		},
	}
	f.register(resume)
	return resume
}

// send sends action to queue's consumers and reports what came of it.
func send(cmd *cobra.Command, g *globals, f sendFlags, queue string, action kill.Action) error {
	k, err := g.killer(cmd, f)
	if err != nil {
		return err
	}
	res, err := k.Send(cmd.Context(), queue, action)
	return report(cmd.OutOrStdout(), res, err, f)
}

// The exit codes of every command but 0 and 1 (see the package doc): 2, what the command
// names (a queue, an exchange, delay levels) does not exist and nothing was done; 3, done in
// part.
const (
	exitNoQueue     = 2
	exitUnconfirmed = 3
)

// exitError is an error that ends warren with an exit code of its own, and says msg.
type exitError struct {
	code int
	msg  string
	err  error
}

func (e *exitError) Error() string { return e.msg }
func (e *exitError) Unwrap() error { return e.err }

// exitCode is the exit code of a command that returned err.
func exitCode(err error) int {
	var e *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e):
		return e.code
	case errors.Is(err, kill.ErrNoQueue): // ops.ErrNoQueue too
		return exitNoQueue
	}
	return 1
}

// report prints what sending res.Action to res.Queue's consumers did, given the error Send
// returned, and returns the error that gives warren its exit code: nobody listening is a
// warning, not a failure.
func report(out io.Writer, res kill.Result, err error, f sendFlags) error {
	var lines []string
	switch {
	case errors.Is(err, kill.ErrNoQueue):
		err = &exitError{exitNoQueue, fmt.Sprintf("queue %s does not exist; nothing was declared or sent "+
			"(--force sends the command all the same: it is remembered for consumers that start later)", res.Queue), err}
	case errors.Is(err, kill.ErrNoListener) && !res.QueueExists:
		lines, err = []string{fmt.Sprintf("warning: queue %s does not exist and no consumer is listening; %s is remembered for consumers that start later",
			res.Queue, res.Action)}, nil
	case errors.Is(err, kill.ErrNoListener):
		lines, err = []string{fmt.Sprintf("warning: no consumer of %s is listening; %s is remembered for consumers that start later",
			res.Queue, res.Action)}, nil
	case err != nil:
		return err
	case f.wait == 0:
		lines = []string{fmt.Sprintf("sent %s to every consumer of %s (not waiting for their confirmations)", res.Action, res.Queue)}
	default:
		lines = confirmations(res, f.wait)
		if !res.Confirmed() {
			err = &exitError{exitUnconfirmed, fmt.Sprintf("%s %s: not confirmed by every consumer", res.Action, res.Queue), nil}
		}
	}
	if f.asJSON {
		if jerr := printResult(out, res, lines, err); jerr != nil {
			return jerr
		}
		return err
	}
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
	return err
}

// confirmations describes the answers to a command that someone heard.
func confirmations(res kill.Result, wait time.Duration) []string {
	had := "the queue had " + plural(res.QueueConsumers, "consumer")
	switch {
	case res.QueueConsumers == 0 && res.Listeners == 0:
		had = "no consumer was counted: stopped ones of earlier warren versions are not; waited all of --wait"
	case res.Listeners > res.QueueConsumers:
		had = fmt.Sprintf("%s listening, %d on the queue: stopped ones have none there", plural(res.Listeners, "consumer"), res.QueueConsumers)
	}
	within := human(min(res.Waited, wait))
	var lines []string
	switch {
	case res.Consumers == 0 && res.Refused == 0:
		lines = append(lines, fmt.Sprintf("warning: no consumer confirmed %s within %s (%s); consumers of an earlier warren version do not answer",
			res.Action, human(wait), had))
	case res.Consumers > 0:
		line := fmt.Sprintf("%s confirmed by %s in %s within %s", res.Action, plural(res.Consumers, "consumer"),
			plural(res.Processes, "process"), within)
		if len(res.States) > 1 {
			var states []string
			for _, s := range slices.Sorted(maps.Keys(res.States)) {
				states = append(states, fmt.Sprintf("%d %s", res.States[s], s))
			}
			line += " (" + strings.Join(states, ", ") + ")"
		}
		line += " (" + had + ")"
		if res.Refused == 0 && !res.Confirmed() {
			line = fmt.Sprintf("warning: %s; the others may still be finishing their messages, run an earlier warren version, or not be warren's", line)
		}
		if res.Action == kill.Delete {
			line += "; they drain the queue, then delete it"
		}
		lines = append(lines, line)
	}
	if res.Refused > 0 {
		why := map[string]bool{}
		for _, a := range res.Answers {
			if a.Error != "" {
				why[a.Error] = true
			}
		}
		lines = append(lines, fmt.Sprintf("warning: %s refused %s: %s (is $WARREN_KILL_SECRET theirs?)",
			plural(res.Refused, "consumer"), res.Action, strings.Join(slices.Sorted(maps.Keys(why)), "; ")))
	}
	if res.Ignored > 0 {
		lines = append(lines, fmt.Sprintf("note: %s ignored: not signed with $WARREN_KILL_SECRET (consumers without it, or forged), "+
			"malformed or duplicated",
			plural(res.Ignored, "answer")))
	}
	return lines
}

// printResult prints res as a JSON object, with the lines of the text report in "report", err
// (which sets the exit code) in "error", and the exit code.
func printResult(out io.Writer, res kill.Result, lines []string, err error) error {
	if res.Answers == nil {
		res.Answers = []kill.Answer{}
	}
	why := ""
	if err != nil {
		why = err.Error()
	}
	obj, jerr := joinJSON(res, struct {
		Confirmed bool     `json:"confirmed"`
		Report    []string `json:"report"`
		Error     string   `json:"error,omitempty"`
		ExitCode  int      `json:"exit_code"`
	}{res.Confirmed(), lines, why, exitCode(err)})
	if jerr != nil {
		return jerr
	}
	return printJSON(out, obj)
}

// plural returns "1 consumer", "2 consumers", "2 processes".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if strings.HasSuffix(what, "s") {
		return fmt.Sprintf("%d %ses", n, what)
	}
	return fmt.Sprintf("%d %ss", n, what)
}

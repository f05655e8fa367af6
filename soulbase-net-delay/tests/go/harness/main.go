// The interop harness around seed 003's Go client, which is in ../delayclient exactly as the
// seed gives it. It connects with the client, schedules tasks, and prints each delivery the
// client's handler receives (the client itself acknowledges it). Commands on stdin:
//
//	schedule N SPREAD_MS DELAY_MS PREFIX   schedule N tasks PREFIX-0..N-1, firing DELAY_MS from
//	                                       now, spread evenly over SPREAD_MS; prints "scheduled N"
//	reconnect                              a new client (the tiny reconnect loop around the
//	                                       unchanged one): retried until the server answers;
//	                                       prints "connected"
//	quit                                   closes the client and exits
//
// Output lines: "connected", "scheduled N", "delivered ID PAYLOAD", "error TEXT".
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"soulbase.dev/delayinterop/delayclient"
)

var out sync.Mutex

func say(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Printf(format+"\n", args...)
}

func connect(addr, route string) *delayclient.Client {
	for attempt := 0; ; attempt++ {
		c, err := delayclient.New(addr, route, func(m delayclient.ReadyMessage) {
			payload, err := m.DecodePayload()
			if err != nil {
				say("error payload of %s: %v", m.ID, err)
				return
			}
			say("delivered %s %s %d", m.ID, string(payload), m.FireAt)
		})
		if err == nil {
			say("connected")
			return c
		}
		if attempt > 200 {
			say("error connecting: %v", err)
			os.Exit(1)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: harness ADDR ROUTE")
		os.Exit(2)
	}
	addr, route := os.Args[1], os.Args[2]
	client := connect(addr, route)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "schedule":
			n, _ := strconv.Atoi(f[1])
			spread, _ := strconv.Atoi(f[2])
			delay, _ := strconv.Atoi(f[3])
			start := time.Now().Add(time.Duration(delay) * time.Millisecond)
			for i := 0; i < n; i++ {
				at := start.Add(time.Duration(spread*i/n) * time.Millisecond)
				id := fmt.Sprintf("%s-%d", f[4], i)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if err := client.Schedule(ctx, at, []byte("payload-"+id), id); err != nil {
					say("error scheduling %s: %v", id, err)
				}
				cancel()
			}
			say("scheduled %d", n)
		case "reconnect":
			client.Close()
			client = connect(addr, route)
		case "quit":
			client.Close()
			return
		}
	}
}

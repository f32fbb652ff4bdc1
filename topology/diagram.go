package topology

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Mermaid draws t, declared with c, as a Mermaid flowchart (left to right): exchanges as
// hexagons, queues as cylinders, bindings as arrows labelled with their key or headers, and
// what declaring t adds: each work queue's poison queue and kill exchange, and the delay
// levels summed up in one node, with the delivery exchange that hands delayed messages to
// the work queues and exchanges, and the parking queue. Dotted arrows are the ways a message
// takes when it fails: dead-lettering, alternate exchanges, parking; and kill commands.
func Mermaid(c Config, t Topology) string {
	g := newGraph(c, t)
	var sb strings.Builder
	sb.WriteString("flowchart LR\n")
	for _, n := range g.nodes {
		label := `"` + strings.ReplaceAll(strings.ReplaceAll(n.label, `"`, "#quot;"), "\n", "<br>") + `"`
		switch n.shape {
		case exchangeShape:
			fmt.Fprintf(&sb, "  %s{{%s}}\n", n.id, label)
		case queueShape:
			fmt.Fprintf(&sb, "  %s[(%s)]\n", n.id, label)
		default:
			fmt.Fprintf(&sb, "  %s[[%s]]\n", n.id, label)
		}
	}
	for _, e := range g.edges {
		arrow := "-->"
		if e.dotted {
			arrow = "-.->"
		}
		label := ""
		if e.label != "" {
			label = `|"` + strings.ReplaceAll(e.label, `"`, "#quot;") + `"|`
		}
		fmt.Fprintf(&sb, "  %s %s%s %s\n", e.from, arrow, label, e.to)
	}
	return sb.String()
}

// DOT draws what Mermaid draws in Graphviz's DOT language (`dot -Tsvg`).
func DOT(c Config, t Topology) string {
	g := newGraph(c, t)
	quote := func(s string) string {
		return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
	}
	var sb strings.Builder
	sb.WriteString("digraph topology {\n  rankdir=LR;\n")
	for _, n := range g.nodes {
		shape := map[shape]string{exchangeShape: "hexagon", queueShape: "cylinder", levelsShape: "box3d"}[n.shape]
		fmt.Fprintf(&sb, "  %s [label=%s, shape=%s];\n", n.id, quote(n.label), shape)
	}
	for _, e := range g.edges {
		var attrs []string
		if e.label != "" {
			attrs = append(attrs, "label="+quote(e.label))
		}
		if e.dotted {
			attrs = append(attrs, "style=dashed")
		}
		fmt.Fprintf(&sb, "  %s -> %s", e.from, e.to)
		if len(attrs) > 0 {
			fmt.Fprintf(&sb, " [%s]", strings.Join(attrs, ", "))
		}
		sb.WriteString(";\n")
	}
	sb.WriteString("}\n")
	return sb.String()
}

type shape int

const (
	exchangeShape shape = iota
	queueShape
	levelsShape
)

type node struct {
	id, label string
	shape     shape
}

type edge struct {
	from, to, label string
	dotted          bool
}

// graph is a topology as nodes and edges, in the order they are drawn.
type graph struct {
	nodes []node
	edges []edge
	ids   map[string]string // "exchange name" or "queue name" to node id
}

func (g *graph) node(what, name, label string, s shape) string {
	key := what + " " + name
	if id, ok := g.ids[key]; ok {
		return id
	}
	id := fmt.Sprintf("n%d", len(g.nodes))
	g.ids[key] = id
	g.nodes = append(g.nodes, node{id: id, label: label, shape: s})
	return id
}

// exchange is the node of exchange name, declared or not (then labelled with its name only).
func (g *graph) exchange(name, label string) string {
	if label == "" {
		label = name
	}
	return g.node("exchange", name, label, exchangeShape)
}

func (g *graph) queue(name, label string) string {
	if label == "" {
		label = name
	}
	return g.node("queue", name, label, queueShape)
}

func (g *graph) edge(from, to, label string, dotted bool) {
	g.edges = append(g.edges, edge{from: from, to: to, label: label, dotted: dotted})
}

func newGraph(c Config, t Topology) *graph {
	c = c.WithDefaults()
	d := c.Delay
	g := &graph{ids: map[string]string{}}
	var deliver string
	if !d.Disabled {
		chain := ""
		if n := d.Chain(); n > 0 {
			chain = fmt.Sprintf(", chain of %d", n)
		}
		levels := g.node("levels", d.Name(), fmt.Sprintf("delay levels %s\n%d %s queues: %d levels, radix %d, unit %s%s\nmax delay %s",
			d.Name(), d.QueueCount(), d.QueueType, d.Levels, d.Radix, d.Unit, chain, maxDelay(d.Max())), levelsShape)
		deliver = g.exchange(d.DeliveryExchange(), d.DeliveryExchange()+"\nheaders, delivers delayed messages")
		parked := g.queue(d.ParkingQueue(), d.ParkingQueue()+"\nparking queue")
		g.edge(levels, deliver, "when due", false)
		g.edge(levels, parked, "bad digit header", true)
		g.edge(deliver, parked, "destination gone", true)
	}
	for _, e := range t.Exchanges { // the declared exchanges first, with their kind
		kind := e.Kind
		if kind == "" {
			kind = c.ExchangeKind
		}
		label := e.Name + "\n" + string(kind)
		if e.Internal {
			label += ", internal"
		}
		g.exchange(e.Name, label)
	}
	for _, e := range t.Exchanges {
		id := g.exchange(e.Name, "")
		if e.AlternateExchange != "" {
			g.edge(id, g.exchange(e.AlternateExchange, ""), "unroutable", true)
		}
		if deliver != "" {
			g.edge(deliver, id, "delayed", false)
		}
	}
	for _, q := range t.Queues {
		typ := q.Type
		if typ == "" {
			typ = c.QueueType
		}
		label := q.Name + "\n" + string(typ)
		if typ == Quorum {
			limit := q.DeliveryLimit
			if limit == 0 {
				limit = c.DeliveryLimit
			}
			label += fmt.Sprintf(", delivery limit %d", limit)
		}
		id := g.queue(q.Name, label)
		g.edge(id, g.queue(PoisonQueue(q.Name), PoisonQueue(q.Name)+"\npoison queue"), "dead-lettered", true)
		g.edge(g.exchange(KillExchange(q.Name), KillExchange(q.Name)+"\nfanout, kill commands"), id, "stops consumers", true)
		if deliver != "" {
			g.edge(deliver, id, "delayed", false)
		}
	}
	for _, b := range t.Bindings {
		from := g.exchange(b.Exchange, "")
		to := ""
		if b.ToExchange != "" {
			to = g.exchange(b.ToExchange, "")
		} else {
			to = g.queue(b.Queue, "")
		}
		g.edge(from, to, bindingLabel(b), false)
	}
	return g
}

// bindingLabel is a binding's key, or its headers ("k=v, k2=v2 (any)"), sorted.
func bindingLabel(b Binding) string {
	if len(b.Headers) == 0 {
		return b.Key
	}
	var pairs []string
	for _, k := range slices.Sorted(maps.Keys(b.Headers)) {
		pairs = append(pairs, k+"="+b.Headers[k])
	}
	match := "all"
	if b.MatchAny {
		match = "any"
	}
	return strings.Join(pairs, ", ") + " (" + match + ")"
}

// maxDelay writes d, and in days too when that is long.
func maxDelay(d time.Duration) string {
	if d < 48*time.Hour {
		return d.String()
	}
	return fmt.Sprintf("%s (%.1f days)", d, d.Hours()/24)
}

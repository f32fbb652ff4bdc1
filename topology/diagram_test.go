package topology_test

import (
	"encoding/xml"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/topology"
)

var diagramTopology = topology.Topology{
	Exchanges: []topology.Exchange{{Name: "ev", AlternateExchange: "lost"}},
	Queues:    []topology.Queue{{Name: "q", DeliveryLimit: 3}},
	Bindings: []topology.Binding{
		{Exchange: "ev", Queue: "q", Headers: map[string]string{"b": "2", "a": "1"}, MatchAny: true},
		{Exchange: "ev", ToExchange: "amq.fanout", Key: `say "hi"`},
	},
}

func TestMermaid(t *testing.T) {
	got := topology.Mermaid(topology.Config{Delay: topology.Delay{Prefix: "d", Levels: 2}}, diagramTopology)
	assert.Equal(t, `flowchart LR
  n0[["delay levels d.quorum.1ms.r16<br>30 quorum queues: 2 levels, radix 16, unit 1ms<br>max delay 255ms"]]
  n1{{"d.quorum.1ms.r16.deliver<br>headers, delivers delayed messages"}}
  n2[("d.quorum.1ms.r16.parked<br>parking queue")]
  n3{{"ev<br>topic"}}
  n4{{"lost"}}
  n5[("q<br>quorum, delivery limit 3")]
  n6[("q.poison<br>poison queue")]
  n7{{"q.kill<br>fanout, kill commands"}}
  n8{{"amq.fanout"}}
  n0 -->|"when due"| n1
  n0 -.->|"bad digit header"| n2
  n1 -.->|"destination gone"| n2
  n3 -.->|"unroutable"| n4
  n1 -->|"delayed"| n3
  n5 -.->|"dead-lettered"| n6
  n7 -.->|"stops consumers"| n5
  n1 -->|"delayed"| n5
  n3 -->|"a=1, b=2 (any)"| n5
  n3 -->|"say #quot;hi#quot;"| n8
`, got)
}

func TestDOTWithoutDelayLevels(t *testing.T) {
	got := topology.DOT(topology.Config{QueueType: topology.Classic, Delay: topology.Delay{Disabled: true}}, diagramTopology)
	assert.Equal(t, `digraph topology {
  rankdir=LR;
  n0 [label="ev\ntopic", shape=hexagon];
  n1 [label="lost", shape=hexagon];
  n2 [label="q\nclassic", shape=cylinder];
  n3 [label="q.poison\npoison queue", shape=cylinder];
  n4 [label="q.kill\nfanout, kill commands", shape=hexagon];
  n5 [label="amq.fanout", shape=hexagon];
  n0 -> n1 [label="unroutable", style=dashed];
  n2 -> n3 [label="dead-lettered", style=dashed];
  n4 -> n2 [label="stops consumers", style=dashed];
  n0 -> n2 [label="a=1, b=2 (any)"];
  n0 -> n5 [label="say \"hi\""];
}
`, got)
}

// The default 193 level and chain queues are one node, whatever the radix and levels.
func TestDiagramSumsUpTheDelayLevels(t *testing.T) {
	f, err := topology.Load(exampleFile)
	require.NoError(t, err)
	dot := topology.DOT(f.Config, f.Topology)
	assert.Contains(t, dot, `n0 [label="delay levels shop.delay.quorum.1ms.r16\n90 quorum queues: 6 levels, radix 16, unit 1ms\nmax delay 4h39m37.215s", shape=box3d];`)
	assert.NotContains(t, dot, ".p0")
	assert.Equal(t, 17, strings.Count(dot, "shape="), "3 of the delay levels, 2 exchanges, 4 work queues with poison queue and kill exchange each")
	assert.Contains(t, topology.Mermaid(topology.Config{}, topology.Topology{}),
		"193 quorum queues: 8 levels, radix 16, unit 1ms, chain of 73<br>max delay 88285h26m19.83s (3678.6 days)")
}

// SVG draws the same nodes and edges, well-formed, every name escaped, each edge from a
// column to one on its right when it can.
func TestSVG(t *testing.T) {
	top := diagramTopology
	top.Queues = append(top.Queues, topology.Queue{Name: "<b>\x1b"})
	got := topology.SVG(topology.Config{Delay: topology.Delay{Prefix: "d", Levels: 2}}, top)
	dec := xml.NewDecoder(strings.NewReader(got))
	counts := map[string]int{}
	xs := map[string]float64{} // the x of each box, by its first line
	var lastX float64
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "well-formed XML")
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
			for _, a := range se.Attr {
				if a.Name.Local == "x" && se.Name.Local == "text" {
					lastX, _ = strconv.ParseFloat(a.Value, 64)
				}
			}
			if se.Name.Local == "text" && len(se.Attr) == 3 { // a box's first line: x, y, font-weight
				tok, err := dec.Token()
				require.NoError(t, err)
				xs[string(tok.(xml.CharData))] = lastX
			}
		}
	}
	assert.Equal(t, 6, counts["polygon"], "deliver, ev, lost, q.kill, amq.fanout, <b>'s kill exchange")
	assert.Equal(t, 5+1, counts["rect"], "parked, q, q.poison, <b>, <b>.poison; the levels")
	assert.Equal(t, 1+13, counts["path"], "the arrow head, then one per edge")
	assert.Contains(t, got, "&lt;b&gt;\\x1b")
	assert.NotContains(t, got, "<b>")
	assert.Less(t, xs["q"], xs["q.poison"])
	assert.Less(t, xs["ev"], xs["q"])
	assert.Less(t, xs["d.quorum.1ms.r16.deliver"], xs["ev"])
}

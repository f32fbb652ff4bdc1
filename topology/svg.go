package topology

import (
	"fmt"
	"html"
	"strings"

	"github.com/warrenmq/warren/internal/visible"
)

// SVG draws what Mermaid draws as a standalone SVG image, laid out here (no renderer
// needed): columns from left to right by the longest way from a node that nothing points
// to, each as wide as its longest label, exchanges as hexagons, queues as rounded boxes, the delay levels as a double box;
// dotted arrows are the ways of failures and kill commands. Every name is escaped, and
// control characters are written out.
func SVG(c Config, t Topology) string {
	g := newGraph(c, t)
	index := make(map[string]int, len(g.nodes))
	for i, n := range g.nodes {
		index[n.id] = i
	}
	// rank: the longest way from a source, counting each edge once per pass; a cycle stops
	// growing after len(nodes) passes.
	rank := make([]int, len(g.nodes))
	for range g.nodes {
		changed := false
		for _, e := range g.edges {
			from, to := index[e.from], index[e.to]
			if rank[to] < rank[from]+1 && rank[from]+1 < len(g.nodes) {
				rank[to], changed = rank[from]+1, true
			}
		}
		if !changed {
			break
		}
	}
	const (
		charW, lineH, pad, gapX, gapY, margin = 7.2, 15.0, 8.0, 70.0, 22.0, 20.0
	)
	type box struct{ x, y, w, h float64 }
	boxes := make([]box, len(g.nodes))
	colW := map[int]float64{} // per rank, the widest box
	ranks := 0
	for i, n := range g.nodes {
		longest := 0
		for _, line := range strings.Split(n.label, "\n") {
			longest = max(longest, len([]rune(visible.String(line))))
		}
		boxes[i].w = max(160, float64(longest)*charW+2*pad+8)
		boxes[i].h = float64(strings.Count(n.label, "\n")+1)*lineH + 2*pad
		colW[rank[i]] = max(colW[rank[i]], boxes[i].w)
		ranks = max(ranks, rank[i]+1)
	}
	colX := make([]float64, ranks)
	for r := 1; r < ranks; r++ {
		colX[r] = colX[r-1] + colW[r-1] + gapX
	}
	heights := map[int]float64{} // per rank, the height used
	width, height := 0.0, 0.0
	for i := range g.nodes {
		b := &boxes[i]
		b.x, b.y = margin+colX[rank[i]], margin+heights[rank[i]]
		heights[rank[i]] += b.h + gapY
		width, height = max(width, b.x+b.w+margin), max(height, b.y+b.h+margin)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" class="topology" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`,
		width, height, width, height)
	sb.WriteString(`<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">` +
		`<path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>`)
	esc := func(s string) string { return html.EscapeString(visible.String(s)) }
	for _, e := range g.edges {
		a, b := boxes[index[e.from]], boxes[index[e.to]]
		x1, y1, x2, y2 := a.x+a.w, a.y+a.h/2, b.x, b.y+b.h/2
		bend := max((x2-x1)/2, 40)
		if x2 <= x1 { // backwards or within a column: around the right side
			x2, bend = b.x+b.w, 60
		}
		dash := ""
		if e.dotted {
			dash = ` stroke-dasharray="5,4"`
		}
		fmt.Fprintf(&sb, `<path d="M%.1f,%.1f C%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="none" stroke="#555"%s marker-end="url(#arrow)"/>`,
			x1, y1, x1+bend, y1, x2-bend, y2, x2, y2, dash)
		if e.label != "" {
			fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f" font-size="10" fill="#555" text-anchor="middle">%s</text>`, (x1+x2)/2, (y1+y2)/2-3, esc(e.label))
		}
	}
	for i, n := range g.nodes {
		b := boxes[i]
		switch n.shape {
		case exchangeShape:
			fmt.Fprintf(&sb, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="#fdf6e3" stroke="#8a6d00"/>`,
				b.x, b.y+b.h/2, b.x+10, b.y, b.x+b.w-10, b.y, b.x+b.w, b.y+b.h/2, b.x+b.w-10, b.y+b.h, b.x+10, b.y+b.h)
		case queueShape:
			fmt.Fprintf(&sb, `<rect x="%.1f" y="%.1f" width="%.0f" height="%.1f" rx="10" fill="#eef4fb" stroke="#2f6fb3"/>`, b.x, b.y, b.w, b.h)
		default:
			fmt.Fprintf(&sb, `<rect x="%.1f" y="%.1f" width="%.0f" height="%.1f" fill="#f4f4f4" stroke="#555" stroke-width="3"/>`, b.x, b.y, b.w, b.h)
		}
		for j, line := range strings.Split(n.label, "\n") {
			weight := ""
			if j == 0 {
				weight = ` font-weight="bold"`
			}
			fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f"%s>%s</text>`, b.x+pad+4, b.y+pad+float64(j+1)*lineH-3, weight, esc(line))
		}
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}

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
	boxes, width, height := g.layout(g.ranks(index))
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" class="topology" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`,
		width, height, width, height)
	sb.WriteString(`<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">` +
		`<path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>`)
	g.drawEdges(&sb, boxes, index)
	g.drawNodes(&sb, boxes)
	sb.WriteString("</svg>\n")
	return sb.String()
}

// The measures of SVG, in pixels: a character's width and a line's height, the padding
// inside a box, the gaps between columns and between boxes, and the margin around it all.
const (
	svgCharW, svgLineH, svgPad, svgGapX, svgGapY, svgMargin = 7.2, 15.0, 8.0, 70.0, 22.0, 20.0
)

// svgBox is where SVG draws a node.
type svgBox struct{ x, y, w, h float64 }

// ranks returns each node's column (nodes by index, the position of a node's id in
// g.nodes): the longest way from a source, counting each edge once per pass; a cycle stops
// growing after len(nodes) passes.
func (g *graph) ranks(index map[string]int) []int {
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
	return rank
}

// layout sizes each node's box to its label and places it in the column of its rank, below
// the ones before it; it returns the boxes and the size of the drawing.
func (g *graph) layout(rank []int) (boxes []svgBox, width, height float64) {
	boxes = make([]svgBox, len(g.nodes))
	colW := map[int]float64{} // per rank, the widest box
	ranks := 0
	for i, n := range g.nodes {
		longest := 0
		for _, line := range strings.Split(n.label, "\n") {
			longest = max(longest, len([]rune(visible.String(line))))
		}
		boxes[i].w = max(160, float64(longest)*svgCharW+2*svgPad+8)
		boxes[i].h = float64(strings.Count(n.label, "\n")+1)*svgLineH + 2*svgPad
		colW[rank[i]] = max(colW[rank[i]], boxes[i].w)
		ranks = max(ranks, rank[i]+1)
	}
	colX := make([]float64, ranks)
	for r := 1; r < ranks; r++ {
		colX[r] = colX[r-1] + colW[r-1] + svgGapX
	}
	heights := map[int]float64{} // per rank, the height used
	for i := range g.nodes {
		b := &boxes[i]
		b.x, b.y = svgMargin+colX[rank[i]], svgMargin+heights[rank[i]]
		heights[rank[i]] += b.h + svgGapY
		width, height = max(width, b.x+b.w+svgMargin), max(height, b.y+b.h+svgMargin)
	}
	return boxes, width, height
}

// svgEscape writes s out visibly, escaped for SVG text.
func svgEscape(s string) string { return html.EscapeString(visible.String(s)) }

// drawEdges writes the edges as curves from the right side of one box to the left side of
// the next, with their labels.
func (g *graph) drawEdges(sb *strings.Builder, boxes []svgBox, index map[string]int) {
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
		fmt.Fprintf(sb, `<path d="M%.1f,%.1f C%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="none" stroke="#555"%s marker-end="url(#arrow)"/>`,
			x1, y1, x1+bend, y1, x2-bend, y2, x2, y2, dash)
		if e.label != "" {
			fmt.Fprintf(sb, `<text x="%.1f" y="%.1f" font-size="10" fill="#555" text-anchor="middle">%s</text>`, (x1+x2)/2, (y1+y2)/2-3, svgEscape(e.label))
		}
	}
}

// drawNodes writes each node's shape and its label, the first line bold.
func (g *graph) drawNodes(sb *strings.Builder, boxes []svgBox) {
	for i, n := range g.nodes {
		b := boxes[i]
		switch n.shape {
		case exchangeShape:
			fmt.Fprintf(sb, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="#fdf6e3" stroke="#8a6d00"/>`,
				b.x, b.y+b.h/2, b.x+10, b.y, b.x+b.w-10, b.y, b.x+b.w, b.y+b.h/2, b.x+b.w-10, b.y+b.h, b.x+10, b.y+b.h)
		case queueShape:
			fmt.Fprintf(sb, `<rect x="%.1f" y="%.1f" width="%.0f" height="%.1f" rx="10" fill="#eef4fb" stroke="#2f6fb3"/>`, b.x, b.y, b.w, b.h)
		default:
			fmt.Fprintf(sb, `<rect x="%.1f" y="%.1f" width="%.0f" height="%.1f" fill="#f4f4f4" stroke="#555" stroke-width="3"/>`, b.x, b.y, b.w, b.h)
		}
		for j, line := range strings.Split(n.label, "\n") {
			weight := ""
			if j == 0 {
				weight = ` font-weight="bold"`
			}
			fmt.Fprintf(sb, `<text x="%.1f" y="%.1f"%s>%s</text>`, b.x+svgPad+4, b.y+svgPad+float64(j+1)*svgLineH-3, weight, svgEscape(line))
		}
	}
}

package delayclient

import (
  "bufio"
  "context"
  "encoding/base64"
  "encoding/json"
  "errors"
  "net"
  "sync"
  "time"
)

type Client struct {
  addr      string
  routeKey  string
  handler   func(ReadyMessage)
  conn      net.Conn
  mu        sync.Mutex
  closeOnce sync.Once
}

type envelope struct {
  Kind string `json:"kind"`
}

type registerMessage struct {
  Kind     string `json:"kind"`
  RouteKey string `json:"route_key"`
}

type scheduleMessage struct {
  Kind          string `json:"kind"`
  RouteKey      string `json:"route_key"`
  FireAt        int64  `json:"fire_at"`
  ID            string `json:"id"`
  Compression   string `json:"compression"`
  PayloadBase64 string `json:"payload_base64"`
}

type ackMessage struct {
  Kind string `json:"kind"`
  ID   string `json:"id"`
}

type ReadyMessage struct {
  Kind          string `json:"kind"`
  ID            string `json:"id"`
  RouteKey      string `json:"route_key"`
  FireAt        int64  `json:"fire_at"`
  PayloadBase64 string `json:"payload_base64"`
}

func (r ReadyMessage) DecodePayload() ([]byte, error) {
  return base64.StdEncoding.DecodeString(r.PayloadBase64)
}

func New(addr, routeKey string, handler func(ReadyMessage)) (*Client, error) {
  conn, err := net.Dial("tcp", addr)
  if err != nil {
    return nil, err
  }
  c := &Client{
    addr:     addr,
    routeKey: routeKey,
    handler:  handler,
    conn:     conn,
  }
  if err := c.send(registerMessage{Kind: "register", RouteKey: routeKey}); err != nil {
    conn.Close()
    return nil, err
  }
  go c.readLoop()
  return c, nil
}

func (c *Client) Schedule(ctx context.Context, fireAt time.Time, payload []byte, id string) error {
  if id == "" {
    return errors.New("id required")
  }
  msg := scheduleMessage{
    Kind:          "schedule",
    RouteKey:      c.routeKey,
    FireAt:        fireAt.UnixMilli(),
    ID:            id,
    Compression:   "none",
    PayloadBase64: base64.StdEncoding.EncodeToString(payload),
  }
  return c.sendWithContext(ctx, msg)
}

func (c *Client) Close() error {
  var err error
  c.closeOnce.Do(func() {
    c.mu.Lock()
    defer c.mu.Unlock()
    if c.conn != nil {
      err = c.conn.Close()
    }
  })
  return err
}

func (c *Client) sendWithContext(ctx context.Context, msg any) error {
  done := make(chan error, 1)
  go func() {
    done <- c.send(msg)
  }()
  select {
  case <-ctx.Done():
    return ctx.Err()
  case err := <-done:
    return err
  }
}

func (c *Client) send(msg any) error {
  data, err := json.Marshal(msg)
  if err != nil {
    return err
  }
  data = append(data, '\n')
  c.mu.Lock()
  defer c.mu.Unlock()
  if c.conn == nil {
    return errors.New("connection closed")
  }
  _, err = c.conn.Write(data)
  return err
}

func (c *Client) readLoop() {
  scanner := bufio.NewScanner(c.conn)
  for scanner.Scan() {
    line := scanner.Bytes()
    var env envelope
    if err := json.Unmarshal(line, &env); err != nil {
      continue
    }
    if env.Kind != "delivery" {
      continue
    }
    var ready ReadyMessage
    if err := json.Unmarshal(line, &ready); err != nil {
      continue
    }
    go c.handler(ready)
    _ = c.send(ackMessage{Kind: "ack", ID: ready.ID})
  }
  c.Close()
}
